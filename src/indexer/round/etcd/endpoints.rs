//! The etcd endpoints, one client each, used one at a time: a request that
//! cannot reach its endpoint (or finds it without a leader) goes to the
//! next one at once, and the rounds stay there.
//!
//! Why not `etcd-client`'s own balancing over every endpoint: its channel
//! keeps sending a share of the requests to an endpoint that is down (each
//! fails with "tcp connect error"), so with one node of three killed a
//! third of the rounds failed and every instance was fenced every few
//! epochs (`etcd_a_node_killed_during_churn_changes_no_epoch`). etcd's Go
//! client moves to another endpoint on such an error, as this does.
//!
//! A request that gets no answer within its time (a node frozen, or cut
//! off without a reset) also moves on: otherwise the round's deadline
//! would drop the request first, and the next round would wait on the
//! same endpoint. So would an expired auth token (`Unauthenticated`): the
//! next endpoint's client authenticates anew.
//!
//! Sending a request again is safe for every request of the rounds: a
//! registration sent twice puts the same key (or finds the round closed,
//! and the instance counts itself out), a close sent twice is refused by
//! its own comparison, a read changes nothing.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

/// The endpoints and their clients, made on first use.
pub(super) struct Endpoints {
    urls: Vec<String>,
    options: ConnectOptions,
    /// How long one request (a connect included) may take on one
    /// endpoint before the next is asked.
    patience: Duration,
    /// One client per endpoint, `None` until used or after it failed.
    clients: Vec<Option<Client>>,
    /// The endpoint in use.
    current: usize,
}

impl Endpoints {
    /// `urls` with `options`, each request given `patience` on one
    /// endpoint; starts at the first endpoint.
    pub(super) fn new(urls: Vec<String>, options: ConnectOptions, patience: Duration) -> Self {
        let clients = vec![None; urls.len()];
        Endpoints {
            urls,
            options,
            patience,
            clients,
            current: 0,
        }
    }

    /// The same endpoints with clients of their own (the lease's keeper
    /// must not wait behind a round, nor a round behind it), starting at
    /// the endpoint in use here, which answered last.
    pub(super) fn fresh(&self, patience: Duration) -> Self {
        let mut fresh = Endpoints::new(self.urls.clone(), self.options.clone(), patience);
        fresh.current = self.current;
        fresh
    }

    /// How long one request may take on one endpoint.
    pub(super) fn patience(&self) -> Duration {
        self.patience
    }

    /// The client of the current endpoint.
    async fn client(&mut self) -> Result<Client, etcd_client::Error> {
        if let Some(client) = &self.clients[self.current] {
            return Ok(client.clone());
        }
        let url = [self.urls[self.current].as_str()];
        let client = Client::connect(url, Some(self.options.clone())).await?;
        self.clients[self.current] = Some(client.clone());
        Ok(client)
    }

    /// Leaves the current endpoint for the next.
    pub(super) fn failed(&mut self) {
        self.clients[self.current] = None;
        self.current = (self.current + 1) % self.urls.len();
    }

    /// Runs `op` on the current endpoint, and on each next one while the
    /// error says the endpoint could not serve it.
    pub(super) async fn run<T, F, Fut>(&mut self, op: F) -> Result<T, etcd_client::Error>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut last = None;
        let patience = self.patience;
        for _ in 0..self.urls.len() {
            let attempt = async {
                let client = self.client().await?;
                op(client).await
            };
            let result = tokio::time::timeout(patience, attempt).await;
            let result = result.unwrap_or_else(|_| {
                let waited = format!("no answer within {patience:?}");
                Err(etcd_client::Error::IoError(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    waited,
                )))
            });
            match result {
                // No answer in time: the next endpoint, but this client
                // is kept (its connection may only be slow, and making a
                // new one, with TLS and a login, is slower still).
                Err(e) if timed_out(&e) => {
                    self.current = (self.current + 1) % self.urls.len();
                    last = Some(e);
                }
                Err(e) if moves_on(&e) => {
                    self.failed();
                    last = Some(e);
                }
                done => return done,
            }
        }
        Err(last.expect("at least one endpoint"))
    }
}

/// Whether `e` is this module's own "no answer in time".
fn timed_out(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::IoError(io) if io.kind() == std::io::ErrorKind::TimedOut)
}

/// Whether another endpoint may serve what this error refused: the
/// endpoint cannot be reached or did not answer in time, it has no leader
/// (it may be the one cut off from the others), or this client's auth
/// token expired (a new client authenticates again).
pub(super) fn moves_on(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unauthenticated
        ),
        _ => false,
    }
}
