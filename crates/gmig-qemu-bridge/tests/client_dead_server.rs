//! The client against a server that dies or stops answering mid-session (a `gmig serve`
//! killed or hung while a VMM uses its vGPU): every request returns an error, none hangs past
//! the client's timeout, and once the connection failed no request is sent on it again (a late
//! reply would otherwise be taken for the next request's).

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::thread;
use std::time::{Duration, Instant};

use gmig_qemu_bridge::client::{Client, ClientError};
use gmig_qemu_bridge::proto::{Header, HEADER_LEN};

/// What the fake server does with the request after VERSION.
#[derive(Clone, Copy)]
enum Then {
    /// Holds the connection open and never answers (a hung or frozen server).
    Hang,
    /// Closes the connection (a killed server).
    Die,
}

/// Answers VERSION, then does `then` with the next request; returns the socket path.
fn fake_server(dir: &std::path::Path, then: Then) -> std::path::PathBuf {
    let path = dir.join("vgpu.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let read_request = |s: &mut UnixStream| {
            let mut head = [0u8; HEADER_LEN];
            s.read_exact(&mut head).ok()?;
            let h = Header::parse(&head, 1 << 20).ok()?;
            let mut payload = vec![0u8; h.payload_len()];
            s.read_exact(&mut payload).ok()?;
            Some(h)
        };
        let Some(version) = read_request(&mut s) else {
            return;
        };
        let mut reply = vec![0u8, 0, 2, 0];
        reply.extend_from_slice(b"{}\0");
        let mut msg = Header::reply(version, reply.len(), None)
            .to_bytes()
            .to_vec();
        msg.extend_from_slice(&reply);
        s.write_all(&msg).expect("VERSION reply");
        let _ = read_request(&mut s);
        match then {
            Then::Die => drop(s),
            Then::Hang => {
                // Answer nothing, keep the socket open until the client has given up.
                let mut sink = [0u8; 64];
                while let Ok(n) = s.read(&mut sink) {
                    if n == 0 {
                        break;
                    }
                }
            }
        }
    });
    path
}

#[test]
fn a_server_that_stops_answering_fails_the_request_at_the_timeout_and_every_later_one_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = fake_server(dir.path(), Then::Hang);
    let mut c = Client::connect(&path).expect("connect");
    c.set_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    // The server never answers: only the timeout can end the request (the bound is far above
    // it so that a busy host cannot fail the test, far below forever).
    let t = Instant::now();
    let e = c.region_info(0).expect_err("a hung server answered");
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t.elapsed()
    );
    assert!(matches!(e, ClientError::TimedOut { .. }), "{e}");
    // A later request fails without waiting: with an hour's timeout, a request that went out
    // and waited for the hung server would hang the test instead of failing it.
    c.set_timeout(Some(Duration::from_secs(3600)))
        .expect("timeout");
    let e = c
        .region_info(0)
        .expect_err("a request went out on a broken connection");
    assert!(matches!(e, ClientError::Broken), "{e}");
}

#[test]
fn a_server_that_dies_fails_the_request_and_every_later_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = fake_server(dir.path(), Then::Die);
    let mut c = Client::connect(&path).expect("connect");
    // A request that waited for the timeout would end `TimedOut`: the dead peer's I/O error
    // must end it first, however slow the host.
    c.set_timeout(Some(Duration::from_secs(3600)))
        .expect("timeout");
    let e = c.region_info(0).expect_err("a dead server answered");
    assert!(matches!(e, ClientError::Io(_)), "{e}");
    let e = c.set_device_state(gmig_vfio_migration::DeviceState::Running);
    assert!(matches!(e, Err(ClientError::Broken)), "{e:?}");
}
