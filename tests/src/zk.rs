//! A real Apache ZooKeeper for tests: Debian's `zookeeper` package, started
//! as `java ... QuorumPeerMain` with its own zoo.cfg on a free loopback port,
//! ready once it answers `ruok`, stopped by PID on drop. A test can
//! [`Zk::kill`] it and [`Zk::restart`] it on the same port and data
//! directory (sessions and records survive, as with a real restart), and ask
//! it how many watches its clients hold ([`Zk::total_watches`], `wchs`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{eventually, free_port};

/// Debian's ZooKeeper jar (its manifest carries the classpath).
const ZOOKEEPER_JAR: &str = "/usr/share/java/zookeeper.jar";

/// A running ZooKeeper server.
pub struct Zk {
    child: Option<Child>,
    /// Client port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
}

impl Zk {
    /// Starts a server and waits until it answers `ruok`. Ticks are 500 ms,
    /// so sessions may be as short as 1 s.
    pub async fn start() -> Zk {
        assert!(
            std::path::Path::new(ZOOKEEPER_JAR).exists(),
            "{ZOOKEEPER_JAR} missing: install Debian's zookeeper package (.ci/run does)"
        );
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("infermesh-zk-{}-{port}", std::process::id()));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        std::fs::write(
            dir.join("zoo.cfg"),
            format!(
                "tickTime=500\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                 admin.enableServer=false\n4lw.commands.whitelist=ruok,stat,wchs,mntr\nmaxClientCnxns=0\n",
                dir.join("data").display()
            ),
        )
        .unwrap();
        let mut zk = Zk {
            child: None,
            port,
            dir,
        };
        zk.restart().await;
        zk
    }

    /// (Re)starts the server on the same port and data directory.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("java")
            .arg(format!("-Dzookeeper.log.dir={}", self.dir.display()))
            .args([
                "-Xmx256m",
                "-cp",
                ZOOKEEPER_JAR,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            ])
            .arg(self.dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(self.dir.join("zk.out")).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("start java (ZooKeeper)");
        self.child = Some(child);
        let port = self.port;
        eventually("ZooKeeper answers ruok", || async move {
            ruok(port).then_some(())
        })
        .await;
    }

    /// Kills the server with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Watches the server holds for all its clients (`wchs`'s "Total
    /// watches"; persistent recursive watches count one per path and
    /// session). `None` while it does not answer.
    pub fn total_watches(&self) -> Option<u64> {
        let out = four_letter(self.port, "wchs")?;
        out.lines()
            .find_map(|l| l.strip_prefix("Total watches:"))?
            .trim()
            .parse()
            .ok()
    }

    /// `127.0.0.1:port`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A registry URL with `chroot` (e.g. "/infermesh").
    pub fn url(&self, chroot: &str) -> String {
        format!("zk://127.0.0.1:{}{chroot}", self.port)
    }
}

impl Drop for Zk {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ruok(port: u16) -> bool {
    four_letter(port, "ruok").is_some_and(|a| a == "imok")
}

/// Sends a four-letter command; the server's answer (it closes after it).
fn four_letter(port: u16, cmd: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(cmd.as_bytes()).ok()?;
    let mut answer = String::new();
    s.take(64 * 1024).read_to_string(&mut answer).ok()?;
    Some(answer)
}
