//! `infermesh`: the one binary — the agent, the ops commands, bench and demo.
//! This file parses arguments and dispatches; each subcommand lives in its
//! own module. Exit codes follow sysexits: 64 usage, 69 unavailable, 78 config.
#![forbid(unsafe_code)]

mod agent_cmd;
mod bench;
mod drill;
mod exit;
mod logging;

use clap::{Parser, Subcommand};

/// infermesh keeps GPU inference serving up and fast across a fleet of GPU
/// hosts: an agent per host that supervises inference workers and fronts them
/// with the Open Inference Protocol, a client library that balances across
/// agents, and these ops commands.
#[derive(Debug, Parser)]
#[command(name = "infermesh", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent on this host: spawn and supervise workers, serve OIP gRPC.
    Agent(agent_cmd::AgentArgs),
    /// Send ModelInfer load to an OIP endpoint and report throughput and latency.
    Bench(bench::BenchArgs),
    /// Inject faults into a running agent's workers under load and report
    /// detection and recovery times (needs test workers and the fake GPU backend).
    Drill(drill::DrillArgs),
    /// Print the version.
    Version,
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Agent(args) => agent_cmd::main(args),
        Command::Bench(args) => bench::main(args),
        Command::Drill(args) => drill::main(args),
        Command::Version => {
            println!("infermesh {}", env!("CARGO_PKG_VERSION"));
            exit::OK
        }
    };
    std::process::exit(code);
}
