//! Normal intranode kernels (placeholder until the next commit).
use eptwin_engine::Plan;
use eptwin_engine::transport::OpSample;

use super::Meta;
use crate::core::{Core, ProgId};
use crate::world::Program;

pub struct IntranodeProgram;
impl IntranodeProgram {
    pub fn new(_plan: &Plan, _core: &mut Core, _meta: Meta) -> Self {
        unimplemented!()
    }
}
impl Program for IntranodeProgram {
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
