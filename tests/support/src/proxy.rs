//! A TCP proxy in front of one Redis server, so a test can take Redis away
//! from one instance (the one connected through the proxy) while the others
//! keep it.
//!
//! It can also add network jitter ([`Proxy::jitter`]): each chunk it
//! forwards waits a random time first, so requests of different clients can
//! reach Redis in another order than they were sent. And it can hold the
//! connections that send something ([`Proxy::hold_on`]), from that request
//! on: a test acts at a known point of a client's work, or takes Redis
//! away from one kind of request (an instance's acks) while the client's
//! other connections go on.
//!
//! Plain std threads: one accepts, two per connection pump bytes. Every open
//! connection is kept in a registry, with clones of both sockets, so `cut`
//! and `Drop` can shut them down from outside; a shut-down socket wakes its
//! pump threads, which then end.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How often a pump wakes without traffic, to deliver bytes held by `hold`
/// once the proxy forwards again.
const PUMP_POLL: Duration = Duration::from_millis(5);
/// How long the accept loop sleeps when nothing is waiting. The listener is
/// non-blocking so the loop can see `stop` without a wake-up connection.
const ACCEPT_POLL: Duration = Duration::from_millis(2);
/// Connect timeout to the target; it is local, so this only matters if the
/// target is gone in an unusual way.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Bytes flow both ways.
    Forward,
    /// Open connections were closed; new ones are accepted and closed at once.
    Cut,
    /// Bytes are read and dropped both ways; new connections are accepted
    /// and never answered.
    Blackhole,
    /// Bytes are read and held both ways, and delivered on restore, as TCP
    /// delivers them when a partition heals: requests arrive late. A side
    /// that closes its connection meanwhile is closed toward the other side
    /// only then, after its held bytes: its FIN is held too.
    Hold,
}

/// One client connection through the proxy.
#[derive(Debug)]
struct Conn {
    client: TcpStream,
    /// `None` for a connection accepted during a blackhole: it never reaches
    /// the target.
    upstream: Option<TcpStream>,
    /// Its client sent `hold_on`'s pattern: its bytes are held both ways
    /// until `restore`, whatever the mode.
    held: bool,
    /// Some bytes were dropped (or it never had an upstream), so the Redis
    /// protocol on it is out of step: a request went unanswered. It is
    /// closed on `restore`, so the client reconnects instead of matching
    /// later replies to the wrong requests.
    tainted: bool,
    /// While forwarding, its bytes are held until then (a slow connect,
    /// [`Proxy::slow_connects`]).
    opens_at: Option<Instant>,
}

impl Conn {
    /// Shuts down both sockets, which the client sees as the connection
    /// closing and which wakes the pump threads blocked on them.
    fn close(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        if let Some(upstream) = &self.upstream {
            let _ = upstream.shutdown(Shutdown::Both);
        }
    }
}

/// State shared between the handle and the threads.
#[derive(Debug)]
struct State {
    mode: Mode,
    /// Open connections by id. A connection leaves the registry only by
    /// being closed, so every pump thread's socket is eventually shut down.
    conns: HashMap<u64, Conn>,
    next_id: u64,
    /// Bytes that hold the connection whose client sends them.
    hold_on: Option<Vec<u8>>,
    /// Connections `hold_on` has held since it was set.
    held: usize,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    stop: AtomicBool,
    /// The most a chunk waits before it is forwarded, in µs (0: no jitter).
    jitter_us: AtomicU64,
    /// How long a new connection's bytes are held after it is accepted, in
    /// µs (0: not at all).
    slow_connect_us: AtomicU64,
    /// Pump threads, joined on drop.
    pumps: Mutex<Vec<JoinHandle<()>>>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes one connection and forgets it; a no-op if it is already gone.
    fn close(&self, id: u64) {
        if let Some(conn) = self.state().conns.remove(&id) {
            conn.close();
        }
    }

    /// Closes every open connection and forgets it.
    fn close_all(&self) {
        for (_, conn) in self.state().conns.drain() {
            conn.close();
        }
    }
}

/// A TCP proxy on a free `127.0.0.1` port, forwarding to a target port.
///
/// [`cut`](Self::cut) makes the link fail loudly (connections close),
/// [`blackhole`](Self::blackhole) makes it fail silently (requests hang),
/// [`restore`](Self::restore) heals it. Dropping it stops listening, closes
/// every connection and joins its threads.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Starts forwarding from a free local port to `127.0.0.1:<target_port>`.
    pub fn start(target_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy listener");
        listener
            .set_nonblocking(true)
            .expect("make proxy listener non-blocking");
        let port = listener
            .local_addr()
            .expect("proxy listener address")
            .port();
        let target = SocketAddr::from(([127, 0, 0, 1], target_port));
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                mode: Mode::Forward,
                conns: HashMap::new(),
                next_id: 0,
                hold_on: None,
                held: 0,
            }),
            stop: AtomicBool::new(false),
            jitter_us: AtomicU64::new(0),
            slow_connect_us: AtomicU64::new(0),
            pumps: Mutex::new(Vec::new()),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            thread::Builder::new()
                .name(format!("proxy-{port}-accept"))
                .spawn(move || accept_loop(&listener, target, &shared))
                .expect("spawn proxy accept thread")
        };
        Proxy {
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Closes every open connection now, and closes new ones as soon as they
    /// are accepted, until [`restore`](Self::restore). Clients see a
    /// connection error at once, not a timeout.
    pub fn cut(&self) {
        let mut state = self.shared.state();
        state.mode = Mode::Cut;
        for (_, conn) in state.conns.drain() {
            conn.close();
        }
    }

    /// Keeps connections open but drops every byte both ways, and accepts
    /// new connections without ever answering: clients see a hang, not an
    /// error. Connections that lose bytes are closed on
    /// [`restore`](Self::restore).
    pub fn blackhole(&self) {
        self.shared.state().mode = Mode::Blackhole;
    }

    /// Keeps connections open and holds every byte both ways; `restore`
    /// delivers them, late, in order. New connections are accepted and
    /// connected, their bytes held too. Models a network partition that
    /// heals: a request sent during it arrives after it. A connection its
    /// client closes during the hold stays open toward Redis until
    /// `restore` (a blocking read it sent stays blocked on the server), as
    /// the client's FIN would not cross the partition either.
    pub fn hold(&self) {
        self.shared.state().mode = Mode::Hold;
    }

    /// Holds every connection whose client sends a chunk that contains
    /// `pattern`, from that chunk on, both ways (as [`hold`](Self::hold)
    /// does for all), until [`restore`](Self::restore): the request that
    /// names it has not reached Redis. Other connections go on. A client
    /// that gives up on a held connection and opens another is held again
    /// as soon as it sends the pattern there. [`held`](Self::held) counts
    /// the connections held. A pattern split across two reads of the
    /// socket is not seen; a Redis client writes each command whole, so a
    /// command name or a script's hash is not split in practice.
    pub fn hold_on(&self, pattern: &[u8]) {
        let mut state = self.shared.state();
        state.hold_on = Some(pattern.to_vec());
        state.held = 0;
    }

    /// How many connections [`hold_on`](Self::hold_on) has held.
    pub fn held(&self) -> usize {
        self.shared.state().held
    }

    /// Delays every chunk forwarded from now on, either way, by a random
    /// time in `[0, max]`, drawn per chunk; `Duration::ZERO` turns it off.
    /// A connection's bytes stay in order (a chunk waits behind the one
    /// before it, and bytes that arrive meanwhile join the next chunk), but
    /// requests on different connections can overtake each other: network
    /// jitter. Independent of `cut`, `blackhole` and `hold`.
    pub fn jitter(&self, max: Duration) {
        let us = u64::try_from(max.as_micros()).unwrap_or(u64::MAX);
        self.shared.jitter_us.store(us, Ordering::SeqCst);
    }

    /// Holds the bytes of each connection accepted from now on, both ways,
    /// for `delay` after its accept, then forwards them: a connect (its
    /// handshake, `HELLO`, `CLIENT ID`) that takes `delay` longer, while the
    /// connections already open keep working. `Duration::ZERO` turns it
    /// off. Independent of the other modes, which apply once it opens.
    pub fn slow_connects(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.shared.slow_connect_us.store(us, Ordering::SeqCst);
    }

    /// Back to forwarding. Connections closed by `cut` stay closed, and
    /// connections that lost bytes to a blackhole are closed now (their
    /// replies would no longer match their requests); clients reconnect.
    /// Connections that were idle during a blackhole keep working.
    pub fn restore(&self) {
        let mut state = self.shared.state();
        state.mode = Mode::Forward;
        state.hold_on = None;
        for conn in state.conns.values_mut() {
            conn.held = false;
        }
        state.conns.retain(|_, conn| {
            if conn.tainted {
                conn.close();
            }
            !conn.tainted
        });
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Cut first, so a connection the acceptor is handling right now is
        // closed on registration instead of outliving the proxy.
        self.cut();
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        // The acceptor is gone, so nothing registers anymore.
        self.shared.close_all();
        let pumps = std::mem::take(
            &mut *self
                .shared
                .pumps
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for pump in pumps {
            let _ = pump.join();
        }
    }
}

/// Accepts until `stop`; the listener is dropped (stops listening) when it
/// returns.
fn accept_loop(listener: &TcpListener, target: SocketAddr, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((client, _)) => handle(client, target, shared),
            // WouldBlock: nobody waiting. Anything else (such as running out
            // of file descriptors) is transient for a test proxy: back off.
            Err(_) => thread::sleep(ACCEPT_POLL),
        }
    }
}

/// Registers one accepted connection according to the current mode and
/// starts its pump threads.
fn handle(client: TcpStream, target: SocketAddr, shared: &Arc<Shared>) {
    // Accepted sockets inherit non-blocking mode on some platforms (macOS).
    if client.set_nonblocking(false).is_err() {
        return;
    }
    let _ = client.set_nodelay(true);
    // Connect outside the lock; the mode is checked again on registration.
    let upstream = if matches!(shared.state().mode, Mode::Forward | Mode::Hold) {
        match TcpStream::connect_timeout(&target, UPSTREAM_CONNECT_TIMEOUT) {
            Ok(upstream) => {
                let _ = upstream.set_nodelay(true);
                Some(upstream)
            }
            // The target is down: the client sees its connection close, as
            // it would see a refused connect without the proxy.
            Err(_) => return,
        }
    } else {
        None
    };

    let mut state = shared.state();
    let tainted = match (state.mode, &upstream) {
        (Mode::Cut, _) => {
            let _ = client.shutdown(Shutdown::Both);
            if let Some(upstream) = &upstream {
                let _ = upstream.shutdown(Shutdown::Both);
            }
            return;
        }
        (Mode::Forward | Mode::Hold, Some(_)) => false,
        // Blackhole now, or mode flipped to Forward after we skipped the
        // upstream connect: never answered, so out of step from the start.
        _ => true,
    };
    // Each pump owns clones of the sockets it reads and writes; the registry
    // keeps one more of each so others can shut them down.
    let Ok(client_read) = client.try_clone() else {
        return;
    };
    let pumps = match &upstream {
        Some(upstream) => {
            let (Ok(client_write), Ok(upstream_read), Ok(upstream_write)) = (
                client.try_clone(),
                upstream.try_clone(),
                upstream.try_clone(),
            ) else {
                return;
            };
            vec![
                (client_read, Some(upstream_write), Side::Client),
                (upstream_read, Some(client_write), Side::Server),
            ]
        }
        None => vec![(client_read, None, Side::Client)],
    };
    let id = state.next_id;
    state.next_id += 1;
    let slow = shared.slow_connect_us.load(Ordering::SeqCst);
    let opens_at = (slow > 0).then(|| Instant::now() + Duration::from_micros(slow));
    state.conns.insert(
        id,
        Conn {
            client,
            upstream,
            held: false,
            tainted,
            opens_at,
        },
    );
    drop(state);

    let mut handles = shared.pumps.lock().unwrap_or_else(PoisonError::into_inner);
    handles.retain(|handle| !handle.is_finished());
    for (from, to, side) in pumps {
        let pump_shared = Arc::clone(shared);
        match thread::Builder::new()
            .name(format!("proxy-conn-{id}"))
            .spawn(move || pump(id, from, to, side, &pump_shared))
        {
            Ok(handle) => handles.push(handle),
            Err(_) => shared.close(id),
        }
    }
}

/// Which side a pump reads from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The client: its requests.
    Client,
    /// Redis: its replies.
    Server,
}

/// Copies `from` to `to` while the proxy forwards, drops the bytes while it
/// blackholes (or when there is no `to`), and closes the whole connection
/// when either side ends, as a TCP proxy would (during a hold, only once it
/// is over). A client's chunk that holds `hold_on`'s pattern holds its
/// connection before it is forwarded.
fn pump(id: u64, mut from: TcpStream, mut to: Option<TcpStream>, side: Side, shared: &Shared) {
    let mut buf = [0u8; 16 * 1024];
    // Bytes read during a hold, delivered once the proxy forwards again.
    let mut held: Vec<u8> = Vec::new();
    let _ = from.set_read_timeout(Some(PUMP_POLL));
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(err) if err.kind() == ErrorKind::Interrupted => continue,
            Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => 0,
            Err(_) => break,
        };
        let mode = {
            let mut state = shared.state();
            let named = side == Side::Client
                && n > 0
                && state.hold_on.as_ref().is_some_and(|pattern| {
                    buf[..n]
                        .windows(pattern.len().max(1))
                        .any(|w| w == pattern.as_slice())
                });
            let mode = state.mode;
            let (mode, newly_held) = match state.conns.get_mut(&id) {
                // Closed by `cut` or by the other pump.
                None => break,
                Some(conn) if conn.tainted => (Mode::Blackhole, false),
                Some(conn) if mode == Mode::Forward && conn.opens_at > Some(Instant::now()) => {
                    (Mode::Hold, false)
                }
                Some(conn) => {
                    if mode == Mode::Blackhole && n > 0 {
                        conn.tainted = true;
                    }
                    let newly_held = named && !conn.held;
                    conn.held |= named;
                    match mode {
                        Mode::Forward if conn.held => (Mode::Hold, newly_held),
                        mode => (mode, newly_held),
                    }
                }
            };
            state.held += usize::from(newly_held);
            mode
        };
        match mode {
            Mode::Hold => held.extend_from_slice(&buf[..n]),
            Mode::Forward => {
                held.extend_from_slice(&buf[..n]);
                if !held.is_empty()
                    && let Some(to) = to.as_mut()
                {
                    jitter(shared);
                    if to.write_all(&held).is_err() {
                        break;
                    }
                    held.clear();
                }
            }
            Mode::Blackhole | Mode::Cut => held.clear(),
        }
    }
    close_after_hold(id, to.as_mut(), &held, shared);
}

/// Waits a random time up to the proxy's jitter, if it has one.
fn jitter(shared: &Shared) {
    let max = shared.jitter_us.load(Ordering::SeqCst);
    if max > 0 {
        thread::sleep(Duration::from_micros(rand::random_range(0..=max)));
    }
}

/// `from` ended: closes the connection, but during a hold only once it is
/// over, after delivering what was held, as a FIN or a reset does not cross
/// a partition before the bytes sent ahead of it.
fn close_after_hold(id: u64, to: Option<&mut TcpStream>, held: &[u8], shared: &Shared) {
    loop {
        let mode = {
            let state = shared.state();
            match state.conns.get(&id) {
                // Closed by `cut`, by the other pump or by `Drop`.
                None => break,
                Some(conn) if conn.tainted => Mode::Blackhole,
                Some(conn) if conn.held && state.mode == Mode::Forward => Mode::Hold,
                Some(_) => state.mode,
            }
        };
        match mode {
            Mode::Hold => thread::sleep(PUMP_POLL),
            Mode::Forward => {
                if let Some(to) = to {
                    let _ = to.write_all(held);
                }
                break;
            }
            Mode::Blackhole | Mode::Cut => break,
        }
    }
    shared.close(id);
}
