//! Where a round writes and reads: the service's Redis (`script`), or
//! etcd when the membership is there (`etcd`, docs/design.md §2.2).

#[cfg(feature = "etcd")]
use super::etcd;
use super::{Counted, RoundLoop, script};
#[cfg(feature = "etcd")]
use crate::assignment::{Assignor, Member};
use crate::connection::Conn;
use crate::error::Result;

impl RoundLoop {
    /// Checks the membership's backend once before the first round: on
    /// etcd, that its settings can work (Redis is checked by the clock's
    /// first reading).
    pub(in crate::indexer) async fn check_membership(&mut self) -> Result<()> {
        #[cfg(feature = "etcd")]
        if let Some(etcd) = self.etcd.as_mut() {
            return etcd.check().await;
        }
        Ok(())
    }

    /// Runs the rounds on etcd when the settings say so; refuses TLS files
    /// that cannot be read.
    #[cfg(feature = "etcd")]
    pub(in crate::indexer) fn with_membership(mut self) -> Result<Self> {
        self.etcd = etcd::EtcdRounds::new(&self.settings, &self.name)?;
        Ok(self)
    }

    /// Without the `etcd` feature every membership is on Redis.
    #[cfg(not(feature = "etcd"))]
    pub(in crate::indexer) fn with_membership(self) -> Result<Self> {
        Ok(self)
    }

    /// The round's write and read, on the backend of the service's
    /// membership.
    pub(super) async fn write_and_read_any(
        &mut self,
        conn: &mut Conn,
        number: u64,
        write: bool,
        prev: Option<Counted>,
    ) -> Result<script::RoundReply> {
        #[cfg(feature = "etcd")]
        if let Some(etcd) = self.etcd.as_mut() {
            let member = Member::name(self.id.as_str(), self.settings.weight);
            let ask = etcd::Ask {
                number,
                member: &member,
                offset_us: self.schedule.offset().as_micros() as u64,
                write,
                read_prev: prev.is_some(),
                rendezvous: self.settings.assignor == Assignor::Rendezvous,
            };
            return etcd.exchange(conn, &self.name, ask).await;
        }
        self.write_and_read(conn, number, write, prev).await
    }
}
