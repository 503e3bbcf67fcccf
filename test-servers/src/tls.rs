//! Certificates for the servers that tests run over TLS (Redis, etcd, ZooKeeper, Postgres,
//! MariaDB): a private CA and a server certificate for `127.0.0.1`, made with `openssl`.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::error::{Result, ServerError};
use crate::process::{Launch, find_program};

/// A CA (`ca.pem`) and a server certificate for `127.0.0.1` (`server.pem`, `server.key`) in `dir`.
pub(crate) fn make_certificates(kind: &'static str, dir: &Path) -> Result<()> {
    let openssl = find_program(kind, "openssl")?;
    let ext = dir.join("server.ext");
    fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .map_err(ServerError::io(
        kind,
        "cannot write the certificate extensions",
    ))?;
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let steps: [Vec<&str>; 3] = [
        [
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=dlock test CA",
            ],
        ]
        .concat(),
        [
            &["req"][..],
            &ec,
            &[
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
        vec![
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    ];
    for step in steps {
        Launch::new(openssl.clone())
            .args(step)
            .cwd(dir)
            .run(kind, Duration::from_secs(30))?;
    }
    Ok(())
}
