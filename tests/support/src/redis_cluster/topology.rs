//! What one node says about the cluster (`CLUSTER NODES`, parsed into
//! [`NodeLine`]s) and the check that every live node agrees on it.

use std::collections::BTreeSet;

use super::slots::SLOTS;

/// One line of `CLUSTER NODES`: a node as the answering node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NodeLine {
    /// The 40-character node id.
    pub(super) id: String,
    /// Client port (0 for a node whose address is not known yet).
    pub(super) port: u16,
    /// Flagged `master` (else `slave`).
    pub(super) master: bool,
    /// Flagged `fail`: the masters agreed it is down. `fail?` is only the
    /// answering node's suspicion and differs between nodes for a while,
    /// so it is left out.
    pub(super) failed: bool,
    /// Flagged `handshake`: not a member yet.
    pub(super) handshake: bool,
    /// The master this replica follows.
    pub(super) master_id: Option<String>,
    /// Slot ranges it serves, inclusive.
    pub(super) slots: Vec<(u16, u16)>,
    /// Slots with an open migration (`[slot->-id]` or `[slot-<-id]`).
    pub(super) open_slots: Vec<u16>,
}

impl NodeLine {
    /// Whether this node serves `slot`.
    pub(super) fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(lo, hi)| (lo..=hi).contains(&slot))
    }
}

/// Parses the reply of `CLUSTER NODES`.
pub(super) fn parse_nodes(text: &str) -> Result<Vec<NodeLine>, String> {
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| parse_line(line).ok_or_else(|| format!("bad CLUSTER NODES line: {line}")))
        .collect()
}

/// `<id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent>
/// <pong-recv> <config-epoch> <link-state> <slot> <slot> ...`
fn parse_line(line: &str) -> Option<NodeLine> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 8 {
        return None;
    }
    let addr = fields[1].split(['@', ',']).next()?;
    let port = addr.rsplit_once(':')?.1.parse().unwrap_or(0);
    let flags: Vec<&str> = fields[2].split(',').collect();
    let mut slots = Vec::new();
    let mut open_slots = Vec::new();
    for field in &fields[8..] {
        if let Some(open) = field.strip_prefix('[') {
            open_slots.push(open.split('-').next()?.parse().ok()?);
        } else if let Some((lo, hi)) = field.split_once('-') {
            slots.push((lo.parse().ok()?, hi.parse().ok()?));
        } else {
            let slot = field.parse().ok()?;
            slots.push((slot, slot));
        }
    }
    Some(NodeLine {
        id: fields[0].to_owned(),
        port,
        master: flags.contains(&"master"),
        failed: flags.contains(&"fail"),
        handshake: flags.contains(&"handshake"),
        master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
        slots,
        open_slots,
    })
}

/// The part of a node's `CLUSTER NODES` that every node must report the
/// same once the cluster has settled: who serves which slots, who
/// replicates whom, who is down. (Ping times, epochs and link states
/// legitimately differ.)
#[derive(Debug, PartialEq, Eq)]
pub(super) struct View {
    /// `(id, master, master_id, failed)` of every node.
    roles: BTreeSet<(String, bool, Option<String>, bool)>,
    /// `(first, last, owner id)` of every slot range.
    slots: BTreeSet<(u16, u16, String)>,
}

/// The agreed part of `lines`, after checking that `lines` alone describe
/// a settled cluster of `node_count` nodes: no handshakes, no open
/// migration, every slot served exactly once.
pub(super) fn settled_view(lines: &[NodeLine], node_count: usize) -> Result<View, String> {
    if lines.len() != node_count {
        return Err(format!("knows {} nodes, not {node_count}", lines.len()));
    }
    if let Some(line) = lines.iter().find(|line| line.handshake) {
        return Err(format!("node {} is still in handshake", line.id));
    }
    if let Some(line) = lines.iter().find(|line| !line.open_slots.is_empty()) {
        return Err(format!(
            "node {} has open slots {:?}",
            line.id, line.open_slots
        ));
    }
    let slots: BTreeSet<(u16, u16, String)> = lines
        .iter()
        .flat_map(|line| line.slots.iter().map(|&(lo, hi)| (lo, hi, line.id.clone())))
        .collect();
    // Sorted by first slot, the ranges must tile 0..16384 with no gap or
    // overlap.
    let mut next = 0u32;
    for &(lo, hi, _) in &slots {
        if u32::from(lo) != next || hi < lo {
            return Err(format!(
                "slots do not tile: range {lo}-{hi} where {next} was due"
            ));
        }
        next = u32::from(hi) + 1;
    }
    if next != u32::from(SLOTS) {
        return Err(format!("slots {next}..{SLOTS} are unassigned"));
    }
    let roles = lines
        .iter()
        .map(|line| {
            (
                line.id.clone(),
                line.master,
                line.master_id.clone(),
                line.failed,
            )
        })
        .collect();
    Ok(View { roles, slots })
}

/// The value of `name` in an `INFO` or `CLUSTER INFO` reply.
pub(super) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}
