//! Byte sizes as people write them.
use serde::{Deserialize, Serialize};

/// A byte size: a number, or a string with a K/M/G/T suffix (powers of 1024). Written out
/// (JSON) as the number of bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Size(pub u64);

/// Why a text is not a byte size.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("{text:?}: unknown size suffix {suffix:?} (use K, M, G or T)")]
    Suffix { text: String, suffix: char },
    #[error("{0:?} is not a size (examples: 4096, 64M, 1G)")]
    NotASize(String),
    #[error("{0:?} is too large")]
    TooLarge(String),
}

pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    // "64MB" and "64MiB" mean 64M, as people write them.
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix("ib"))
        .or_else(|| {
            t.strip_suffix(['B', 'b'])
                .filter(|n| n.ends_with(|c: char| c.is_ascii_alphabetic()))
        })
        .unwrap_or(t);
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                'B' => 1,
                _ => {
                    return Err(SizeError::Suffix {
                        text: s.to_string(),
                        suffix: c,
                    })
                }
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| SizeError::NotASize(s.to_string()))?;
    n.checked_mul(mult).ok_or_else(|| SizeError::TooLarge(s.to_string()))
}

impl std::str::FromStr for Size {
    type Err = SizeError;
    fn from_str(s: &str) -> Result<Size, SizeError> {
        parse_size(s).map(Size)
    }
}

/// The shortest exact form (`64M`, `1G`, `4097`), which [`parse_size`] reads back: how a
/// default shows in `--help`.
impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = [(40, 'T'), (30, 'G'), (20, 'M'), (10, 'K')]
            .into_iter()
            .find(|(shift, _)| self.0 != 0 && self.0.is_multiple_of(1u64 << shift));
        match unit {
            Some((shift, c)) => write!(f, "{}{c}", self.0 >> shift),
            None => write!(f, "{}", self.0),
        }
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Size(n)),
            Raw::S(s) => parse_size(&s).map(Size).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("lots").is_err());
        for (s, n) in [
            ("64MB", 64u64 << 20),
            ("64MiB", 64 << 20),
            ("1GB", 1 << 30),
            ("4096B", 4096),
            ("4096", 4096),
        ] {
            assert_eq!(parse_size(s), Ok(n), "{s}");
        }
    }

    #[test]
    fn sizes_show_in_a_form_they_are_read_back_from() {
        for n in [
            0,
            1,
            4096,
            4097,
            128 << 10,
            64 << 20,
            1536 << 20,
            1 << 30,
            16 << 30,
            3 << 40,
        ] {
            let shown = Size(n).to_string();
            assert_eq!(shown.parse::<Size>(), Ok(Size(n)), "{shown}");
        }
        assert_eq!(Size(64 << 20).to_string(), "64M");
        assert_eq!(Size(1536 << 20).to_string(), "1536M");
    }
}
