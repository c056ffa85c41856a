//! Transports: every kind carries a stream intact; a dropped peer gives clean errors; the
//! bandwidth cap paces writes.

use std::io::{ErrorKind, Read, Write};
use std::thread;
use std::time::{Duration, Instant};

use gmig_core::transport::{mem_pair, Connection, Counted, Endpoint, Throttled, TokenBucket};

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// Send `data` one way and echo a 4-byte reply back, over any pair of connected ends.
fn exchange(mut a: Box<dyn Connection>, mut b: Box<dyn Connection>, data: &[u8]) {
    let expect = data.to_vec();
    let rx = thread::spawn(move || {
        let mut got = vec![0u8; expect.len()];
        b.read_exact(&mut got).unwrap();
        assert!(got == expect, "payload differs");
        b.write_all(b"done").unwrap();
        b
    });
    a.write_all(data).unwrap();
    a.flush().unwrap();
    let mut reply = [0u8; 4];
    a.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"done");
    rx.join().unwrap();
}

#[test]
fn memory_pair_carries_a_stream_with_backpressure() {
    let (a, b) = mem_pair(4096);
    exchange(Box::new(a), Box::new(b), &pattern(1 << 20));
}

#[test]
fn tcp_carries_a_stream() {
    let (a, b) = gmig_test_support::tcp_pair();
    exchange(a, b, &pattern(1 << 20));
}

#[test]
fn unix_socket_carries_a_stream_and_cleans_up() {
    let dir = std::env::temp_dir().join(format!("gmig-transport-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mig.sock");
    let _ = std::fs::remove_file(&path);
    let listener = Endpoint::Unix(path.clone()).listen().unwrap();
    let endpoint = listener.endpoint().unwrap();
    let server = thread::spawn(move || {
        let c = listener.accept().unwrap();
        (c, listener)
    });
    let a = endpoint.connect().unwrap();
    let (b, listener) = server.join().unwrap();
    exchange(a, b, &pattern(300_000));
    drop(listener);
    assert!(!path.exists(), "the listener removes its socket path");
    let _ = std::fs::remove_dir(&dir);
}

#[test]
fn connecting_to_nothing_is_a_clean_error() {
    // Bind then drop to get a port that is (almost certainly) closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = Endpoint::Tcp(port).connect().err().expect("nobody listens");
    assert!(
        err.to_string()
            .starts_with("cannot connect to tcp:127.0.0.1:"),
        "{err}"
    );
    let err = Endpoint::Unix("/nonexistent/gmig.sock".into())
        .connect()
        .err()
        .expect("no socket");
    assert!(err.to_string().contains("/nonexistent/gmig.sock"), "{err}");
}

#[test]
fn dropped_memory_peer_gives_eof_and_broken_pipe() {
    let (mut a, b) = mem_pair(64);
    drop(b);
    assert_eq!(a.write(b"x").unwrap_err().kind(), ErrorKind::BrokenPipe);
    let mut buf = [0u8; 8];
    assert_eq!(a.read(&mut buf).unwrap(), 0);

    // A writer blocked on a full pipe wakes up with an error when the reader goes away.
    let (mut a, b) = mem_pair(16);
    let t = thread::spawn(move || a.write_all(&[1u8; 1000]));
    thread::sleep(Duration::from_millis(20));
    drop(b);
    assert_eq!(t.join().unwrap().unwrap_err().kind(), ErrorKind::BrokenPipe);
}

#[test]
fn dropped_tcp_peer_gives_eof_then_errors() {
    let listener = Endpoint::Tcp("127.0.0.1:0".parse().unwrap())
        .listen()
        .unwrap();
    let endpoint = listener.endpoint().unwrap();
    let server = thread::spawn(move || listener.accept().unwrap());
    let mut a = endpoint.connect().unwrap();
    let b = server.join().unwrap();
    b.shutdown().unwrap();
    drop(b);
    let mut buf = [0u8; 8];
    assert_eq!(a.read(&mut buf).unwrap(), 0);
    // Writes to a closed TCP peer fail within a few attempts (RST after the first).
    let mut failed = false;
    for _ in 0..64 {
        if a.write_all(&[0u8; 65536]).is_err() {
            failed = true;
            break;
        }
        thread::sleep(Duration::from_millis(2));
    }
    assert!(failed, "writing to a dropped TCP peer must fail");
}

#[test]
fn read_timeout_is_honoured() {
    let (mut a, _b) = mem_pair(64);
    a.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let t0 = Instant::now();
    let err = a.read(&mut [0u8; 4]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert!(t0.elapsed() >= Duration::from_millis(20));
}

#[test]
fn write_timeout_is_honoured_when_the_peer_stops_reading() {
    let (mut a, _b) = mem_pair(64);
    a.set_write_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let t0 = Instant::now();
    let err = a.write_all(&[0u8; 1000]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TimedOut);
    assert!(t0.elapsed() >= Duration::from_millis(20));
}

#[test]
fn a_destination_that_stops_reading_times_the_source_out() {
    use gmig_core::migration::synthetic::{SyntheticConfig, SyntheticVm};
    use gmig_core::migration::{migrate_source, source_handle, MigrationConfig, Policy};
    let cfg_toy = SyntheticConfig {
        pages: 512,
        seed: 1,
        max_cmd_pages: 4,
        opaque_every: 0,
    };
    let vm = SyntheticVm::new(cfg_toy, 0x0400_0000, 0x4000_0000).unwrap();
    let mut cfg = MigrationConfig::new(Policy::StopAndCopy);
    cfg.timeout = Duration::from_millis(100);
    let (a, _b) = mem_pair(4096); // nobody reads `_b`
    let mut h = source_handle(vm, &cfg).unwrap();
    let t0 = Instant::now();
    let err = migrate_source(&mut h, a, &cfg, &mut |_| {}).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(5), "{err}");
    assert!(err.to_string().contains("timed out"), "{err}");
}

#[test]
fn cut_connection_fails_exactly_at_the_mark() {
    let (a, mut b) = mem_pair(1 << 20);
    let mut a = Counted::new(a).cut_after(1000);
    let counters = a.counters();
    let err = a.write_all(&[9u8; 4000]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionReset);
    assert_eq!(counters.sent(), 1000);
    // The peer saw at most the bytes before the cut, then end of input.
    let mut got = Vec::new();
    let _ = b.read_to_end(&mut got);
    assert!(got.len() <= 1000);
}

#[test]
fn counters_count_both_directions() {
    let (a, mut b) = mem_pair(1 << 16);
    let mut a = Counted::new(a);
    let c = a.counters();
    a.write_all(&[1u8; 5000]).unwrap();
    b.write_all(&[2u8; 300]).unwrap();
    let mut buf = [0u8; 300];
    a.read_exact(&mut buf).unwrap();
    assert_eq!((c.sent(), c.received()), (5000, 300));
}

#[test]
fn token_bucket_computes_the_wait_for_a_link_speed() {
    let mut bucket = TokenBucket::for_link(1.0).unwrap();
    assert_eq!(bucket.rate(), 125_000_000.0);
    let burst = bucket.burst();
    assert_eq!(burst, 125_000);
    let now = Instant::now();
    bucket.take(burst); // the bucket starts full: no wait
                        // Empty now: another full burst takes burst / rate = 1 ms.
    let wait = bucket.delay_for(burst, now);
    assert!(
        wait >= Duration::from_micros(900) && wait <= Duration::from_micros(1100),
        "{wait:?}"
    );
    assert!(TokenBucket::for_link(0.0).is_err());
    assert!(TokenBucket::for_link(f64::NAN).is_err());
}

#[test]
fn throttled_link_paces_writes() {
    // 0.2 Gbit/s = 25 MB/s: 2.5 MB beyond the initial burst takes about 100 ms.
    let (a, mut b) = mem_pair(1 << 22);
    let mut a = Throttled::new(a, 0.2).unwrap();
    let reader = thread::spawn(move || {
        let mut sink = Vec::new();
        b.read_to_end(&mut sink).unwrap();
        sink.len()
    });
    let t0 = Instant::now();
    a.write_all(&vec![0u8; 2_500_000 + 65_536]).unwrap();
    let took = t0.elapsed();
    drop(a);
    assert_eq!(reader.join().unwrap(), 2_565_536);
    assert!(
        took >= Duration::from_millis(95),
        "paced write took only {took:?}"
    );
    assert!(took < Duration::from_secs(10), "paced write took {took:?}");
}

/// A socket bound to a port and connected to that same port meets itself (TCP's simultaneous
/// open); that is what a connect retried while nothing listens can get when the kernel picks
/// the destination's port as the source. `met_itself` tells it from a real connection.
#[test]
fn a_socket_connected_to_itself_is_told_from_a_real_connection() {
    use nix::sys::socket::{
        bind, connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
    };
    use std::os::fd::AsRawFd;

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::empty(),
        None,
    )
    .unwrap();
    setsockopt(&fd, sockopt::ReuseAddr, &true).unwrap();
    let at = SockaddrIn::new(127, 0, 0, 1, port);
    bind(fd.as_raw_fd(), &at).unwrap();
    connect(fd.as_raw_fd(), &at).unwrap();
    let itself = std::net::TcpStream::from(fd);
    assert!(gmig_core::transport::met_itself(&itself));

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let real = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    assert!(!gmig_core::transport::met_itself(&real));
}
