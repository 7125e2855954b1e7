use eptwin_engine::ids::JobId;
use eptwin_engine::scenario::schema::OpKind;
use std::path::Path;
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let loaded = eptwin_engine::load(Path::new(&args[0])).unwrap();
    let plan = eptwin_engine::Plan::build(&loaded).unwrap();
    let op = if args.get(1).map(|s| s.as_str()) == Some("combine") {
        OpKind::Combine
    } else {
        OpKind::Dispatch
    };
    let mut world = eptwin_sim::build_world(&plan, false);
    let mut factory = |core: &mut eptwin_sim::core::Core, j: JobId, o: OpKind, it: u32, w: bool| {
        eptwin_sim::make_program(&plan, core, j, o, it, w)
    };
    let r = world.run_one(&mut factory, JobId(0), op, 0, false);
    println!("{:?}", r.err());
    let ob = world.core.op_bytes[0];
    println!("{:?} events {} now {}", ob, world.core.events, world.core.now);
    let qps = &world.core.net.qps;
    let posted: u64 = qps.iter().map(|q| q.posted as u64).sum();
    println!("qps {} posted {}", qps.len(), posted);
    for s in &world.samples {
        println!("{:?}", s);
    }
    for n in 0..4u32 {
        let p = &world.core.net.ports[n as usize];
        println!("nic{n} tx busy {} us bytes {}", p.busy_ps as f64 / 1e6, p.tx_bytes);
    }
}
