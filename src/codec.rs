//! How task payloads become bytes and back.
//!
//! A [`Codec`] is chosen per service (it is recorded in `{N}:meta`, so a
//! producer and a consumer cannot silently disagree) and its name is also
//! written into every stream entry. [`Bincode`] (bincode 2 with serde) is the
//! default: compact and fast. [`Json`] lets producers written in other
//! languages enqueue tasks.

use std::fmt::{self, Write as _};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::CodecError;

/// Turns typed task payloads into bytes and back.
///
/// Implemented by [`Bincode`] and [`Json`]; the trait is sealed so that the
/// name stored in Redis always identifies one of the formats the guide
/// documents for other languages.
pub trait Codec: sealed::Sealed + Send + Sync + Clone + fmt::Debug + Default + 'static {
    /// The codec's name, as stored in `{N}:meta` and in each entry.
    const NAME: &'static str;

    /// Encodes `value`.
    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError>;

    /// Decodes a value of type `T`.
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError>;
}

pub(crate) use sealed::EachCodec;

mod sealed {
    use super::CodecError;

    pub trait Sealed {
        /// This codec's encoding among `each`'s: a new codec must say
        /// where its own is, or the crate does not build.
        fn chosen(each: &EachCodec) -> &Result<Vec<u8>, CodecError>;
    }
    impl Sealed for super::Bincode {
        fn chosen(each: &EachCodec) -> &Result<Vec<u8>, CodecError> {
            &each.bincode
        }
    }
    impl Sealed for super::Json {
        fn chosen(each: &EachCodec) -> &Result<Vec<u8>, CodecError> {
            &each.json
        }
    }

    /// A value encoded with every codec there is, for a value given before
    /// the codec that encodes it is known: a periodic job's task, given to
    /// the consumer's builder, whose codec may still change after it (the
    /// codec is part of the builder's type). Which one is used is decided
    /// when the consumer starts, by [`EachCodec::by`]. Public only as
    /// the sealed trait is: nothing outside the crate can name it.
    #[derive(Debug)]
    pub struct EachCodec {
        pub(super) bincode: Result<Vec<u8>, CodecError>,
        pub(super) json: Result<Vec<u8>, CodecError>,
    }
}

impl EachCodec {
    /// `value`, encoded with every codec (an encoding may fail for one
    /// codec and not another: a map with non-string keys is no JSON).
    pub(crate) fn of<T: Serialize>(value: &T) -> Self {
        EachCodec {
            bincode: Bincode.encode(value),
            json: Json.encode(value),
        }
    }

    /// The value as codec `C` encodes it.
    pub(crate) fn by<C: Codec>(&self) -> Result<&[u8], &CodecError> {
        C::chosen(self).as_deref()
    }
}

/// bincode 2 with serde, its standard configuration (variable-length
/// integers, little endian). The default.
///
/// Decoding refuses a payload that would decode to more than 1 GiB (as
/// bincode counts it, about the value's size in memory): bincode allocates
/// a string or byte buffer as long as its length prefix says before it
/// reads it, so without a limit ten bytes claiming 2^64 of them panic, and
/// a claim of some terabytes aborts the process. 1 GiB is twice the
/// largest entry a consumer accepts.
///
/// bincode has no nesting limit: a task type that contains itself (an
/// `enum` with a `Box<Self>` variant, say) lets a payload of a few kilobytes
/// nest deep enough to overflow the stack, which aborts the process. Use
/// [`Json`] (nesting limit 128) for such types.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bincode;

/// The most bytes a bincode decode may claim; see [`Bincode`].
const BINCODE_DECODE_LIMIT: usize = 1 << 30;

impl Codec for Bincode {
    const NAME: &'static str = "bincode";

    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        bincode::serde::encode_to_vec(value, bincode::config::standard()).map_err(|e| CodecError {
            codec: Self::NAME,
            message: e.to_string(),
        })
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError> {
        // The limit is not part of the format: what `encode` writes (with
        // the standard configuration) reads back unchanged.
        let config = bincode::config::standard().with_limit::<BINCODE_DECODE_LIMIT>();
        let (value, read) =
            bincode::serde::decode_from_slice(bytes, config).map_err(|e| CodecError {
                codec: Self::NAME,
                message: e.to_string(),
            })?;
        // Trailing bytes mean the payload was written for another type.
        if read != bytes.len() {
            return Err(CodecError {
                codec: Self::NAME,
                message: format!("{} trailing bytes after the value", bytes.len() - read),
            });
        }
        Ok(value)
    }
}

/// JSON (serde_json), for producers written in other languages.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Codec for Json {
    const NAME: &'static str = "json";

    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        serde_json::to_vec(value).map_err(|e| CodecError {
            codec: Self::NAME,
            message: e.to_string(),
        })
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError> {
        serde_json::from_slice(bytes).map_err(|e| CodecError {
            codec: Self::NAME,
            message: e.to_string(),
        })
    }
}

/// A task's payload as the admin tools show it (their JSON output): the
/// JSON value itself when the payload is JSON, else its bytes in hex, so a
/// bincode payload can still be told apart and copied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Shown {
    /// The payload's size in bytes.
    pub(crate) payload_bytes: usize,
    /// The payload, when its codec is `json` and it parses.
    pub(crate) payload: Option<serde_json::Value>,
    /// The payload in lowercase hex, when it is not shown as JSON.
    pub(crate) payload_hex: Option<String>,
}

/// How `payload`, encoded with the codec named `codec`, is shown.
pub(crate) fn shown(codec: &str, payload: &[u8]) -> Shown {
    let json = (codec == Json::NAME)
        .then(|| serde_json::from_slice(payload).ok())
        .flatten();
    let hex = json.is_none().then(|| {
        payload.iter().fold(String::new(), |mut hex, b| {
            let _ = write!(hex, "{b:02x}"); // writing to a String cannot fail
            hex
        })
    });
    Shown {
        payload_bytes: payload.len(),
        payload: json,
        payload_hex: hex,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Mail {
        to: String,
        body: String,
        retries: u32,
        tags: Vec<String>,
    }

    fn round_trip<C: Codec>(codec: C, mail: &Mail) -> Mail {
        codec.decode(&codec.encode(mail).unwrap()).unwrap()
    }

    proptest! {
        #[test]
        fn both_codecs_round_trip(to in ".*", body in ".*", retries: u32, tags in proptest::collection::vec(".*", 0..4)) {
            let mail = Mail { to, body, retries, tags };
            prop_assert_eq!(round_trip(Bincode, &mail), mail.clone());
            prop_assert_eq!(round_trip(Json, &mail), mail);
        }
    }

    #[test]
    fn each_codec_holds_what_each_codec_encodes() {
        let mail = Mail {
            to: "a@b".into(),
            body: "hi".into(),
            retries: 3,
            tags: vec!["x".into()],
        };
        let each = EachCodec::of(&mail);
        assert_eq!(
            each.by::<Bincode>().unwrap(),
            Bincode.encode(&mail).unwrap()
        );
        assert_eq!(each.by::<Json>().unwrap(), Json.encode(&mail).unwrap());
        // A map with keys that are no strings is no JSON, but bincode.
        let keyed = std::collections::BTreeMap::from([((1u8, 2u8), 3u8)]);
        let each = EachCodec::of(&keyed);
        assert!(each.by::<Bincode>().is_ok());
        assert_eq!(each.by::<Json>().unwrap_err().codec, "json");
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bytes in [&b""[..], b"\xff\xff\xff\xff\xff", b"{not json"] {
            assert!(Bincode.decode::<Mail>(bytes).is_err());
            assert!(Json.decode::<Mail>(bytes).is_err());
        }
    }

    #[test]
    fn a_huge_length_prefix_is_an_error_not_an_allocation() {
        // A string said to be 2^64 - 1 bytes long (unlimited, bincode
        // panics: capacity overflow), then 2^40 bytes (unlimited, the
        // allocation fails and aborts the process), then just over the
        // limit; each followed by nothing.
        for len in [u64::MAX, 1 << 40, (BINCODE_DECODE_LIMIT as u64) + 1] {
            let mut bytes = vec![253];
            bytes.extend(len.to_le_bytes());
            let err = Bincode.decode::<Mail>(&bytes).unwrap_err();
            assert!(err.message.contains("LimitExceeded"), "{len}: {err}");
            assert!(Bincode.decode::<Vec<u8>>(&bytes).is_err());
        }
        // Within the limit, it fails at the read: the input is too short.
        let mut bytes = vec![253];
        bytes.extend((1u64 << 20).to_le_bytes());
        assert!(Bincode.decode::<String>(&bytes).is_err());
    }

    #[test]
    fn json_payloads_are_shown_as_json_and_the_rest_in_hex() {
        let json = shown("json", br#"{"to":"a@b"}"#);
        assert_eq!(json.payload, Some(serde_json::json!({"to": "a@b"})));
        assert_eq!((json.payload_bytes, json.payload_hex), (12, None));
        let bincode = shown("bincode", &[0x01, 0xab]);
        assert_eq!(bincode.payload, None);
        assert_eq!(bincode.payload_hex.as_deref(), Some("01ab"));
        let broken = shown("json", b"{not json");
        assert_eq!(broken.payload_hex.as_deref(), Some("7b6e6f74206a736f6e"));
    }

    #[test]
    fn json_is_plain_json() {
        let mail = Mail {
            to: "a@b".into(),
            body: "hi".into(),
            retries: 1,
            tags: vec![],
        };
        let text = String::from_utf8(Json.encode(&mail).unwrap()).unwrap();
        assert_eq!(text, r#"{"to":"a@b","body":"hi","retries":1,"tags":[]}"#);
    }
}
