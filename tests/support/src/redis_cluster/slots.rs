//! Which hash slot a key belongs to, computed as Redis does (`keyHashSlot`
//! in `src/cluster.c`), so a test can pick keys for a slot or a master
//! without asking a server.

/// Number of hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag modulo 16384.
///
/// The hash tag is the part between the first `{` and the first `}` after
/// it, when that part is not empty; otherwise the whole key is hashed. So
/// `{svc/0}:a` and `{svc/0}:b` share a slot, while `{}x` hashes whole.
pub fn slot_of(key: &str) -> u16 {
    crc16_xmodem(hash_tag(key.as_bytes())) % SLOTS
}

/// The bytes Redis hashes for `key`.
fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    match key[open + 1..].iter().position(|&b| b == b'}') {
        Some(len) if len > 0 => &key[open + 1..open + 1 + len],
        _ => key,
    }
}

/// CRC-16/XMODEM: polynomial 0x1021, initial value 0, no reflection, the
/// variant Redis uses (`crc16.c`). Bitwise rather than table-driven: the
/// harness hashes a handful of keys.
fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}
