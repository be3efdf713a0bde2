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
//! Sending a request again is safe for every request of the rounds: a
//! registration sent twice puts the same key (or finds the round closed,
//! and the instance counts itself out), a close sent twice is refused by
//! its own comparison, a read changes nothing.

use std::future::Future;

use etcd_client::{Client, ConnectOptions};

/// The endpoints and their clients, made on first use.
pub(super) struct Endpoints {
    urls: Vec<String>,
    options: ConnectOptions,
    clients: Vec<Option<Client>>,
    current: usize,
}

impl Endpoints {
    pub(super) fn new(urls: Vec<String>, options: ConnectOptions) -> Self {
        let clients = vec![None; urls.len()];
        Endpoints {
            urls,
            options,
            clients,
            current: 0,
        }
    }

    /// The same endpoints with clients of their own (the lease's keeper
    /// must not wait behind a round, nor a round behind it).
    pub(super) fn fresh(&self) -> Self {
        Endpoints::new(self.urls.clone(), self.options.clone())
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
        for _ in 0..self.urls.len() {
            let result = match self.client().await {
                Ok(client) => op(client).await,
                Err(e) => Err(e),
            };
            match result {
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

/// Whether another endpoint may serve what this error refused: the
/// endpoint cannot be reached, or it has no leader (it may be the one cut
/// off from the others).
fn moves_on(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
        ),
        _ => false,
    }
}
