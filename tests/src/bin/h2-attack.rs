//! `h2-attack ATTACK --target HOST:PORT --server agent|web --duration 12s`:
//! runs one HTTP/2 attack of issue 24 (see `infermesh_tests::h2attack`)
//! and prints its report as one JSON line. `h2-attack list` names them;
//! `h2-attack good --target ... --server web --duration 12s` is a
//! well-behaved client (1 s deadline) printing its p99 and errors.
//! Used by `scripts/h2-attacks.sh`.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use infermesh_tests::h2attack::{self, Attack, Budget, Server};

fn usage() -> ExitCode {
    eprintln!(
        "usage: h2-attack ATTACK --target HOST:PORT [--server agent|web] [--duration 12s]\n       h2-attack list"
    );
    ExitCode::from(64)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(name) = args.first() else {
        return usage();
    };
    if name == "list" {
        for a in Attack::ALL {
            println!("{}", a.name());
        }
        return ExitCode::SUCCESS;
    }
    let attack = Attack::parse(name);
    if attack.is_none() && name != "good" {
        eprintln!("unknown attack {name:?} (h2-attack list)");
        return ExitCode::from(64);
    }
    let (mut target, mut server, mut duration) = (None, Server::Agent, "12s".to_string());
    let mut rest = args[1..].iter();
    while let Some(flag) = rest.next() {
        let Some(value) = rest.next() else {
            return usage();
        };
        match flag.as_str() {
            "--target" => target = value.parse().ok(),
            "--server" => match Server::parse(value) {
                Some(s) => server = s,
                None => return usage(),
            },
            "--duration" => duration = value.clone(),
            _ => return usage(),
        }
    }
    let (Some(target), Ok(duration)) = (target, humantime::parse_duration(&duration)) else {
        return usage();
    };
    match attack {
        Some(attack) => {
            let report = h2attack::run(attack, target, server, Budget::for_duration(duration));
            println!("{}", report.json());
        }
        None => {
            let good = h2attack::good::run(target, server, duration, Duration::from_secs(1));
            println!("{}", good.json());
        }
    }
    ExitCode::SUCCESS
}
