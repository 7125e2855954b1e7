//! Normal internode kernels (placeholder until the next commit).
use eptwin_engine::Plan;
use eptwin_engine::transport::OpSample;

use super::Meta;
use crate::core::{Core, ProgId};
use crate::world::Program;

pub struct InternodeProgram;
impl InternodeProgram {
    pub fn new(_plan: &Plan, _core: &mut Core, _meta: Meta) -> Self {
        unimplemented!()
    }
}
impl Program for InternodeProgram {
    fn start(&mut self, _core: &mut Core, _me: ProgId) {}
    fn wake(&mut self, _core: &mut Core, _me: ProgId, _actor: u32) {}
    fn is_done(&self) -> bool {
        true
    }
    fn finish(&mut self, _core: &Core) -> OpSample {
        unimplemented!()
    }
    fn describe(&self, _actor: u32) -> String {
        String::new()
    }
}
