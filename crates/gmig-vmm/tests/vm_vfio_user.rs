//! The same guest with the vGPU out of process, over vfio-user: the same results as in process,
//! and a whole-VM migration between two vfio-user servers equals an unmigrated run.

mod common;

use common::*;
use gmig_vmm::{GuestConfig, GuestProfile, Machine, Stop};

#[test]
fn over_vfio_user_the_guest_gets_the_same_results_and_migrates() {
    if !kvm_present() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    for profile in GuestProfile::ALL {
        let c = GuestConfig {
            profile,
            frames: 16,
            ..GuestConfig::default()
        };
        let base = baseline(&c);
        let name = profile.name();
        // Out of process: the same exits, the same GPU progress, the same results.
        let path = serve_vgpu(dir.path(), &format!("{name}-run.sock"), 0);
        let mut m = Machine::boot(RAM, &c, remote(&path)).expect("boot over vfio-user");
        assert_eq!(m.run(ALL).expect("run"), Stop::Halted);
        assert_same_run(&base, &m, &format!("{name} over vfio-user"));
        assert_eq!(base.exits, m.exits, "{name}: the same exits");

        // Migration between two servers: DMA logging and the device state over vfio-user.
        let src = serve_vgpu(dir.path(), &format!("{name}-src.sock"), 0);
        let dst = serve_vgpu(dir.path(), &format!("{name}-dst.sock"), 1);
        let mut s = Machine::boot(RAM, &c, remote(&src)).expect("boot");
        s.run_until(ALL, |m| m.frames_done() >= 6).expect("run");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let addr = listener.local_addr().expect("address");
        let t = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accept");
            gmig_vmm::migrate::migrate_in(&mut conn, remote(&dst))
        });
        let mut conn = std::net::TcpStream::connect(addr).expect("connect");
        let rep = gmig_vmm::migrate::migrate_out(&mut s, &c, &mut conn, &opts())
            .expect("migration over vfio-user");
        let (mut d, _) = t.join().expect("thread").expect("destination");
        eprintln!("{name} over vfio-user: {rep:?}");
        assert!(rep.final_gpu_only_pages > 0 || rep.precopy_pages > 0);
        assert_eq!(d.run(ALL).expect("run on"), Stop::Halted);
        assert_same_run(&base, &d, &format!("{name} migrated over vfio-user"));
    }
}
