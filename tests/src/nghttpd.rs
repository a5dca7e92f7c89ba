//! nghttpd (Debian's `nghttp2-server`), the reference HTTP/2 server the
//! conformance and attack harnesses hold the agent beside: plaintext on a
//! free loopback port, serving a scratch docroot, stopped on drop.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{PATIENCE, free_port};

/// The page every docroot serves at `/` (longer than the 5 octets the
/// flow-control cases need).
pub const INDEX_HTML: &str = "<!DOCTYPE html><title>infermesh h2 reference</title>\n";

/// A running nghttpd.
pub struct Nghttpd {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its docroot (holds `index.html`).
    pub docroot: PathBuf,
}

impl Nghttpd {
    /// Starts nghttpd and waits until it accepts connections. Fails the
    /// test with a hint if it is not installed.
    pub fn start() -> Nghttpd {
        let port = free_port();
        let docroot =
            std::env::temp_dir().join(format!("infermesh-nghttpd-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&docroot).unwrap();
        std::fs::write(docroot.join("index.html"), INDEX_HTML).unwrap();
        let child = Command::new("nghttpd")
            .args(["--no-tls", "-a", "127.0.0.1", "-d"])
            .arg(&docroot)
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("start nghttpd ({e}): install Debian's nghttp2-server, as .ci/run does")
            });
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let server = Nghttpd {
            child,
            addr,
            docroot,
        };
        let deadline = Instant::now() + PATIENCE;
        while TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "nghttpd did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Nghttpd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.docroot);
    }
}
