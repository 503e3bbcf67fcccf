//! A tiny blocking Redis (RESP2) client: enough to probe, configure and inspect test servers without a Redis
//! client crate.

use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A Redis reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resp {
    /// `+OK`
    Simple(String),
    /// `-ERR …`
    Error(String),
    /// `:1`
    Integer(i64),
    /// `$…`; `None` is the null bulk string.
    Bulk(Option<Vec<u8>>),
    /// `*…`; `None` is the null array.
    Array(Option<Vec<Resp>>),
}

impl Resp {
    /// The reply as text, for simple strings, errors, integers and bulk strings; `None` otherwise.
    pub fn as_text(&self) -> Option<String> {
        match self {
            Resp::Simple(s) | Resp::Error(s) => Some(s.clone()),
            Resp::Integer(i) => Some(i.to_string()),
            Resp::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            Resp::Bulk(None) | Resp::Array(_) => None,
        }
    }

    /// The elements of an array reply (empty for anything else).
    pub fn items(&self) -> &[Resp] {
        match self {
            Resp::Array(Some(items)) => items,
            _ => &[],
        }
    }

    /// Whether this is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }
}

impl fmt::Display for Resp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resp::Simple(s) => write!(f, "{s}"),
            Resp::Error(s) => write!(f, "(error) {s}"),
            Resp::Integer(i) => write!(f, "(integer) {i}"),
            Resp::Bulk(Some(b)) => write!(f, "{:?}", String::from_utf8_lossy(b)),
            Resp::Bulk(None) | Resp::Array(None) => write!(f, "(nil)"),
            Resp::Array(Some(items)) => {
                write!(f, "[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{item}")?;
                }
                write!(f, "]")
            }
        }
    }
}

/// Encodes a command as a RESP array of bulk strings.
pub fn encode_command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one reply from `reader`.
///
/// # Errors
/// On I/O errors, end of stream, or a malformed reply.
pub fn read_reply(reader: &mut impl BufRead) -> io::Result<Resp> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad RESP line {line:?}"),
        )
    };
    let (kind, rest) = line.split_at_checked(1).ok_or_else(bad)?;
    Ok(match kind {
        "+" => Resp::Simple(rest.to_owned()),
        "-" => Resp::Error(rest.to_owned()),
        ":" => Resp::Integer(rest.parse().map_err(|_| bad())?),
        "$" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            if len < 0 {
                Resp::Bulk(None)
            } else {
                let len = usize::try_from(len).map_err(|_| bad())?;
                let mut buf = vec![0; len.saturating_add(2)];
                reader.read_exact(&mut buf)?;
                buf.truncate(len);
                Resp::Bulk(Some(buf))
            }
        }
        "*" => {
            let len: i64 = rest.parse().map_err(|_| bad())?;
            if len < 0 {
                Resp::Array(None)
            } else {
                let items = (0..len)
                    .map(|_| read_reply(reader))
                    .collect::<io::Result<_>>()?;
                Resp::Array(Some(items))
            }
        }
        _ => return Err(bad()),
    })
}

/// Connects to `addr`, sends one command and reads its reply (timeouts: 1 s to connect, 5 s per read/write).
///
/// An error reply is returned as `Ok(Resp::Error(..))`, not as `Err`.
///
/// # Errors
/// On connection or protocol failure.
pub fn redis_command(addr: SocketAddr, args: &[&str]) -> io::Result<Resp> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    (&stream).write_all(&encode_command(args))?;
    read_reply(&mut BufReader::new(&stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nested_replies() {
        let mut input: &[u8] = b"*3\r\n+OK\r\n$3\r\nabc\r\n*2\r\n:5\r\n$-1\r\n";
        let reply = read_reply(&mut input).unwrap();
        assert_eq!(
            reply,
            Resp::Array(Some(vec![
                Resp::Simple("OK".into()),
                Resp::Bulk(Some(b"abc".to_vec())),
                Resp::Array(Some(vec![Resp::Integer(5), Resp::Bulk(None)])),
            ]))
        );
        assert_eq!(encode_command(&["PING"]), b"*1\r\n$4\r\nPING\r\n");
    }
}
