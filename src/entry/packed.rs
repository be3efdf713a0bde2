//! MessagePack as Redis's `cmsgpack` writes it: the primitives the task
//! records' reader uses (`tracking::packed`), and a delayed set's member,
//! an entry's field-value list (`enqueue.lua`, `fenced_retry.lua`), which
//! the delayed tasks' listing and a reshard's move read.

/// Takes the next `n` bytes.
pub(crate) fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if bytes.len() < n {
        return None;
    }
    let (head, tail) = bytes.split_at(n);
    *bytes = tail;
    Some(head)
}

/// A big-endian unsigned number of `width` bytes.
pub(crate) fn unsigned(bytes: &mut &[u8], width: usize) -> Option<u64> {
    Some(
        take(bytes, width)?
            .iter()
            .fold(0, |n, b| (n << 8) | u64::from(*b)),
    )
}

/// The value of field `name` in a flat name, value, name, value, … list
/// (an entry's fields as [`unpack_strings`] reads them).
pub(crate) fn value_of<'a>(fields: &'a [Vec<u8>], name: &str) -> Option<&'a [u8]> {
    fields
        .chunks(2)
        .find(|kv| kv.len() == 2 && kv[0] == name.as_bytes())
        .map(|kv| kv[1].as_slice())
}

/// What places a task whose fields are `fields` (docs/design.md §3): its
/// `key`, else its `id`.
pub(crate) fn route_key(fields: &[Vec<u8>]) -> &[u8] {
    value_of(fields, super::field::KEY)
        .or_else(|| value_of(fields, super::field::ID))
        .unwrap_or_default()
}

/// Decodes a MessagePack array of strings (or binaries), as Redis's
/// `cmsgpack.pack` writes a Lua list of strings; `None` for anything else.
pub(crate) fn unpack_strings(mut bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
    let number = |bytes: &mut &[u8], width| unsigned(bytes, width).map(|n| n as usize);
    let marker = *take(&mut bytes, 1)?.first()?;
    let len = match marker {
        0x90..=0x9f => usize::from(marker & 0x0f),
        0xdc => number(&mut bytes, 2)?,
        0xdd => number(&mut bytes, 4)?,
        _ => return None,
    };
    // Each item takes at least one byte: a longer claim is corrupt.
    if len > bytes.len() {
        return None;
    }
    let mut items = Vec::with_capacity(len);
    for _ in 0..len {
        let marker = *take(&mut bytes, 1)?.first()?;
        let size = match marker {
            0xa0..=0xbf => usize::from(marker & 0x1f),
            0xd9 | 0xc4 => number(&mut bytes, 1)?,
            0xda | 0xc5 => number(&mut bytes, 2)?,
            0xdb | 0xc6 => number(&mut bytes, 4)?,
            _ => return None,
        };
        items.push(take(&mut bytes, size)?.to_vec());
    }
    bytes.is_empty().then_some(items)
}
