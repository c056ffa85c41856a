//! Transports that carry a migration stream: an in-memory pair, TCP and Unix sockets, with an
//! optional bandwidth cap (a token bucket) to emulate 1, 10 or 25 Gbit/s links.
//!
//! Every transport is a [`Connection`]: a blocking, ordered, duplex byte stream. A dropped peer shows
//! as end of input on read and as an error on write, never as a hang or a panic.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Errors setting up a transport.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// Binding the listening endpoint failed.
    #[error("cannot listen on {endpoint}: {source}")]
    Listen {
        /// The endpoint.
        endpoint: String,
        /// The OS error.
        source: io::Error,
    },
    /// Connecting failed.
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// The OS error.
        source: io::Error,
    },
    /// Accepting a connection failed.
    #[error("accept on {endpoint} failed: {source}")]
    Accept {
        /// The endpoint.
        endpoint: String,
        /// The OS error.
        source: io::Error,
    },
    /// A bandwidth cap that is not a positive, finite number.
    #[error("invalid link speed {gbps} Gbit/s")]
    BadRate {
        /// The value given.
        gbps: f64,
    },
}

/// Result of transport setup.
pub type Result<T> = std::result::Result<T, TransportError>;

/// A blocking, ordered, duplex byte stream between the two ends of a migration.
pub trait Connection: Read + Write + Send {
    /// Close both directions now; the peer sees end of input and write errors.
    fn shutdown(&self) -> io::Result<()>;
    /// Give reads a deadline (`None`: block for ever). A read past it fails with `TimedOut` or
    /// `WouldBlock`.
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
    /// Give writes a deadline (`None`: block for ever), so a peer that stops reading cannot hang
    /// the writer. A write past it fails with `TimedOut` or `WouldBlock`.
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
}

/// Implements [`Connection`] for a wrapper `W<C>` by forwarding to its `inner: C` field; the
/// wrapper's own behaviour lives in its `Read`/`Write` impls.
#[macro_export]
macro_rules! forward_connection {
    ($wrapper:ident) => {
        impl<C: $crate::transport::Connection> $crate::transport::Connection for $wrapper<C> {
            fn shutdown(&self) -> ::std::io::Result<()> {
                self.inner.shutdown()
            }
            fn set_read_timeout(
                &self,
                timeout: ::std::option::Option<::std::time::Duration>,
            ) -> ::std::io::Result<()> {
                self.inner.set_read_timeout(timeout)
            }
            fn set_write_timeout(
                &self,
                timeout: ::std::option::Option<::std::time::Duration>,
            ) -> ::std::io::Result<()> {
                self.inner.set_write_timeout(timeout)
            }
        }
    };
}

impl Connection for TcpStream {
    fn shutdown(&self) -> io::Result<()> {
        TcpStream::shutdown(self, std::net::Shutdown::Both)
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, timeout)
    }
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_write_timeout(self, timeout)
    }
}

impl Connection for UnixStream {
    fn shutdown(&self) -> io::Result<()> {
        UnixStream::shutdown(self, std::net::Shutdown::Both)
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        UnixStream::set_read_timeout(self, timeout)
    }
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        UnixStream::set_write_timeout(self, timeout)
    }
}

impl<C: Connection + ?Sized> Connection for Box<C> {
    fn shutdown(&self) -> io::Result<()> {
        (**self).shutdown()
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        (**self).set_read_timeout(timeout)
    }
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        (**self).set_write_timeout(timeout)
    }
}

/// Where a migration listens or connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A Unix-domain socket path.
    Unix(PathBuf),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "tcp:{a}"),
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl Endpoint {
    /// Connect to a listening destination.
    pub fn connect(&self) -> Result<Box<dyn Connection>> {
        let err = |source| TransportError::Connect {
            endpoint: self.to_string(),
            source,
        };
        match self {
            Endpoint::Tcp(addr) => {
                let s = TcpStream::connect(addr).map_err(err)?;
                // Connecting to a local port nobody listens on can meet itself: when the kernel
                // picks that very port as the source, TCP's simultaneous open connects the
                // socket to itself. That is no destination; say so as a refused connection.
                if met_itself(&s) {
                    return Err(err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        "connected to itself: nothing listens there",
                    )));
                }
                // Small control frames must not wait for Nagle.
                s.set_nodelay(true).map_err(err)?;
                Ok(Box::new(s))
            }
            Endpoint::Unix(path) => Ok(Box::new(UnixStream::connect(path).map_err(err)?)),
        }
    }

    /// Bind a listener.
    pub fn listen(&self) -> Result<Listener> {
        let err = |source| TransportError::Listen {
            endpoint: self.to_string(),
            source,
        };
        match self {
            Endpoint::Tcp(addr) => Ok(Listener::Tcp(TcpListener::bind(addr).map_err(err)?)),
            Endpoint::Unix(path) => Ok(Listener::Unix(
                UnixListener::bind(path).map_err(err)?,
                path.clone(),
            )),
        }
    }
}

/// Whether `s` is connected to itself (its own address is its peer's).
pub fn met_itself(s: &TcpStream) -> bool {
    matches!((s.local_addr(), s.peer_addr()), (Ok(l), Ok(p)) if l == p)
}

/// A bound listener for incoming migrations.
#[derive(Debug)]
pub enum Listener {
    /// TCP.
    Tcp(TcpListener),
    /// Unix socket (the path is removed when the listener is dropped).
    Unix(UnixListener, PathBuf),
}

impl Listener {
    /// The endpoint actually bound (with the port chosen when 0 was asked).
    pub fn endpoint(&self) -> Result<Endpoint> {
        match self {
            Listener::Tcp(l) => {
                l.local_addr()
                    .map(Endpoint::Tcp)
                    .map_err(|source| TransportError::Listen {
                        endpoint: "tcp".into(),
                        source,
                    })
            }
            Listener::Unix(_, p) => Ok(Endpoint::Unix(p.clone())),
        }
    }

    /// Wait for one incoming connection.
    pub fn accept(&self) -> Result<Box<dyn Connection>> {
        match self {
            Listener::Tcp(l) => {
                let (s, _) = l.accept().map_err(|source| TransportError::Accept {
                    endpoint: format!("{:?}", l.local_addr().ok()),
                    source,
                })?;
                s.set_nodelay(true)
                    .map_err(|source| TransportError::Accept {
                        endpoint: "tcp".into(),
                        source,
                    })?;
                Ok(Box::new(s))
            }
            Listener::Unix(l, p) => {
                let (s, _) = l.accept().map_err(|source| TransportError::Accept {
                    endpoint: p.display().to_string(),
                    source,
                })?;
                Ok(Box::new(s))
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// In-memory pair
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Default)]
struct PipeState {
    buf: VecDeque<u8>,
    /// The writing end is gone: readers drain what is left, then see end of input.
    writer_closed: bool,
    /// The reading end is gone: writes fail.
    reader_closed: bool,
}

#[derive(Debug, Default)]
struct Pipe {
    state: Mutex<PipeState>,
    cond: Condvar,
}

impl Pipe {
    fn lock(&self) -> MutexGuard<'_, PipeState> {
        // A poisoned lock only means another thread panicked while holding it; the byte queue is
        // still consistent (every update is a single push or drain), so go on with it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits for the other end to change the pipe, until `deadline` if there is one; past it,
    /// a `TimedOut` error saying which `op` timed out.
    fn wait<'a>(
        &'a self,
        s: MutexGuard<'a, PipeState>,
        deadline: Option<Instant>,
        op: &str,
    ) -> io::Result<MutexGuard<'a, PipeState>> {
        use std::sync::PoisonError;
        match deadline {
            None => Ok(self.cond.wait(s).unwrap_or_else(PoisonError::into_inner)),
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("{op} timed out"),
                    ));
                }
                Ok(self
                    .cond
                    .wait_timeout(s, d - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0)
            }
        }
    }
}

/// One end of an in-memory connection made by [`mem_pair`].
#[derive(Debug)]
pub struct MemConnection {
    rx: Arc<Pipe>,
    tx: Arc<Pipe>,
    capacity: usize,
    read_timeout: Mutex<Option<Duration>>,
    write_timeout: Mutex<Option<Duration>>,
}

/// Two connected in-memory ends; each direction buffers at most `capacity` bytes (writers block
/// when it is full, as on a socket).
pub fn mem_pair(capacity: usize) -> (MemConnection, MemConnection) {
    let a = Arc::new(Pipe::default());
    let b = Arc::new(Pipe::default());
    let capacity = capacity.max(1);
    (
        MemConnection {
            rx: a.clone(),
            tx: b.clone(),
            capacity,
            read_timeout: Mutex::new(None),
            write_timeout: Mutex::new(None),
        },
        MemConnection {
            rx: b,
            tx: a,
            capacity,
            read_timeout: Mutex::new(None),
            write_timeout: Mutex::new(None),
        },
    )
}

impl MemConnection {
    fn close(&self) {
        {
            let mut s = self.tx.lock();
            s.writer_closed = true;
        }
        self.tx.cond.notify_all();
        {
            let mut s = self.rx.lock();
            s.reader_closed = true;
            s.buf.clear();
        }
        self.rx.cond.notify_all();
    }
}

impl Read for MemConnection {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        let timeout = *self
            .read_timeout
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut s = self.rx.lock();
        loop {
            if s.reader_closed {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    "connection shut down locally",
                ));
            }
            if !s.buf.is_empty() {
                let n = out.len().min(s.buf.len());
                for (dst, src) in out.iter_mut().zip(s.buf.drain(..n)) {
                    *dst = src;
                }
                drop(s);
                self.rx.cond.notify_all();
                return Ok(n);
            }
            if s.writer_closed {
                return Ok(0);
            }
            s = self.rx.wait(s, deadline, "read")?;
        }
    }
}

impl Write for MemConnection {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        let timeout = *self
            .write_timeout
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut s = self.tx.lock();
        loop {
            if s.reader_closed || s.writer_closed {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "peer closed the connection",
                ));
            }
            let room = self.capacity.saturating_sub(s.buf.len());
            if room > 0 {
                let n = room.min(data.len());
                s.buf.extend(&data[..n]);
                drop(s);
                self.tx.cond.notify_all();
                return Ok(n);
            }
            s = self.tx.wait(s, deadline, "write")?;
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Connection for MemConnection {
    fn shutdown(&self) -> io::Result<()> {
        self.close();
        Ok(())
    }
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        *self
            .read_timeout
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = timeout;
        Ok(())
    }
    fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        *self
            .write_timeout
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = timeout;
        Ok(())
    }
}

impl Drop for MemConnection {
    fn drop(&mut self) {
        self.close();
    }
}

// ---------------------------------------------------------------------------------------------
// Bandwidth cap
// ---------------------------------------------------------------------------------------------

/// A token bucket: `rate` bytes per second, bursts of at most `burst` bytes.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A bucket for a link of `gbps` Gbit/s, with a burst of one millisecond's worth (at least
    /// 64 KiB), starting full.
    pub fn for_link(gbps: f64) -> Result<Self> {
        if !(gbps.is_finite() && gbps > 0.0) {
            return Err(TransportError::BadRate { gbps });
        }
        let rate = gbps * 1e9 / 8.0;
        let burst = (rate / 1000.0).max(65536.0);
        Ok(Self {
            rate,
            burst,
            tokens: burst,
            last: Instant::now(),
        })
    }

    /// Bytes per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Largest grant one call gives.
    pub fn burst(&self) -> usize {
        self.burst as usize
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        self.last = now;
    }

    /// How long to wait before `n` bytes (at most one burst) may go, without taking them.
    pub fn delay_for(&mut self, n: usize, now: Instant) -> Duration {
        self.refill(now);
        let need = n as f64 - self.tokens;
        if need <= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(need / self.rate)
        }
    }

    /// Block until `n` bytes (at most one burst) may go, then take them.
    pub fn take(&mut self, n: usize) {
        let n = n.min(self.burst());
        loop {
            let wait = self.delay_for(n, Instant::now());
            if wait.is_zero() {
                break;
            }
            std::thread::sleep(wait);
        }
        self.tokens -= n as f64;
    }
}

/// A connection whose writes are paced to a link speed.
#[derive(Debug)]
pub struct Throttled<C> {
    inner: C,
    bucket: TokenBucket,
}

impl<C> Throttled<C> {
    /// Pace writes on `inner` to `gbps` Gbit/s.
    pub fn new(inner: C, gbps: f64) -> Result<Self> {
        Ok(Self {
            inner,
            bucket: TokenBucket::for_link(gbps)?,
        })
    }
}

impl<C: Read> Read for Throttled<C> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf)
    }
}

impl<C: Write> Write for Throttled<C> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(self.bucket.burst());
        if n == 0 {
            return Ok(0);
        }
        self.bucket.take(n);
        self.inner.write(&data[..n])
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

forward_connection!(Throttled);

// ---------------------------------------------------------------------------------------------
// Accounting and fault injection
// ---------------------------------------------------------------------------------------------

/// Byte counters shared between a [`Counted`] connection and whoever reports on it.
#[derive(Debug, Clone, Default)]
pub struct ByteCounters {
    sent: Arc<AtomicU64>,
    received: Arc<AtomicU64>,
}

impl ByteCounters {
    /// Bytes written so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
    /// Bytes read so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

/// A connection that counts the bytes it carries, and can be cut after a given number of bytes
/// written (to test how both ends handle a connection that drops mid-stream).
#[derive(Debug)]
pub struct Counted<C> {
    inner: C,
    counters: ByteCounters,
    cut_after: Option<u64>,
}

impl<C> Counted<C> {
    /// Count bytes on `inner`.
    pub fn new(inner: C) -> Self {
        Self {
            inner,
            counters: ByteCounters::default(),
            cut_after: None,
        }
    }

    /// Shut the connection down once `bytes` have been written: the write that would pass the
    /// mark writes up to it, then every later write fails with `ConnectionReset`.
    pub fn cut_after(mut self, bytes: u64) -> Self {
        self.cut_after = Some(bytes);
        self
    }

    /// The shared counters.
    pub fn counters(&self) -> ByteCounters {
        self.counters.clone()
    }
}

impl<C: Read> Read for Counted<C> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.counters
            .received
            .fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

impl<C: Connection> Write for Counted<C> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut data = data;
        if let Some(limit) = self.cut_after {
            let sent = self.counters.sent();
            if sent >= limit {
                let _ = self.inner.shutdown();
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    format!("connection cut after {limit} bytes (fault injection)"),
                ));
            }
            let room = usize::try_from(limit - sent).unwrap_or(usize::MAX);
            data = &data[..data.len().min(room)];
        }
        let n = self.inner.write(data)?;
        self.counters.sent.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

forward_connection!(Counted);
