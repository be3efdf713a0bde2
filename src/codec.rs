//! How task payloads become bytes and back.
//!
//! A [`Codec`] is chosen per service (it is recorded in `{N}:meta`, so a
//! producer and a consumer cannot silently disagree) and its name is also
//! written into every stream entry. [`Bincode`] (bincode 2 with serde) is the
//! default: compact and fast. [`Json`] lets producers written in other
//! languages enqueue tasks.

use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A payload could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[error("{codec}: {message}")]
pub struct CodecError {
    /// The codec's name.
    pub codec: &'static str,
    /// What went wrong.
    pub message: String,
}

/// Turns typed task payloads into bytes and back.
///
/// Implemented by [`Bincode`] and [`Json`]; the trait is sealed so that the
/// name stored in Redis always identifies one of the formats the README
/// documents for other languages.
pub trait Codec: sealed::Sealed + Send + Sync + Clone + fmt::Debug + Default + 'static {
    /// The codec's name, as stored in `{N}:meta` and in each entry.
    const NAME: &'static str;

    /// Encodes `value`.
    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError>;

    /// Decodes a value of type `T`.
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Bincode {}
    impl Sealed for super::Json {}
}

/// bincode 2 with serde, its standard configuration (variable-length
/// integers, little endian). The default.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bincode;

impl Codec for Bincode {
    const NAME: &'static str = "bincode";

    fn encode<T: Serialize>(&self, value: &T) -> Result<Vec<u8>, CodecError> {
        bincode::serde::encode_to_vec(value, bincode::config::standard()).map_err(|e| CodecError {
            codec: Self::NAME,
            message: e.to_string(),
        })
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError> {
        let (value, read) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())
            .map_err(|e| CodecError {
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
    fn garbage_is_an_error_not_a_panic() {
        for bytes in [&b""[..], b"\xff\xff\xff\xff\xff", b"{not json"] {
            assert!(Bincode.decode::<Mail>(bytes).is_err());
            assert!(Json.decode::<Mail>(bytes).is_err());
        }
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
