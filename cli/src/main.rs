//! `infermesh`: the one binary — the agent, the ops commands, bench and demo.
//! This file parses arguments and dispatches; each subcommand lives in its
//! own module. Exit codes follow sysexits: 1 failure, 64 usage, 69 unavailable, 77 no
//! permission (admin token), 78 config.
#![forbid(unsafe_code)]

mod agent_cmd;
mod bench;
mod demo;
mod drill;
mod exit;
mod logging;
mod ops;
mod say;
mod shim;

use clap::{CommandFactory, Parser, Subcommand};

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
    /// Run three agents with test workers on this machine, drive load through the
    /// client library, crash and slow down workers midway, and show how traffic moves.
    #[command(long_about = demo::ABOUT)]
    Demo(demo::DemoArgs),
    /// Inject faults into a running agent's workers under load and report
    /// detection and recovery times (needs test workers and the fake GPU backend).
    #[command(long_about = drill::ABOUT)]
    Drill(drill::DrillArgs),
    /// List the nodes of a service: id, zone, state, weight, models, in-flight, version.
    Nodes(ops::nodes::NodesArgs),
    /// Show a node's agent: state, workers, restarts, faults, health verdicts, GPUs.
    Status(ops::status::StatusArgs),
    /// Run a node's health checks now and print each verdict (exit 1 if any fails).
    Health(ops::health::HealthArgs),
    /// Stop clients sending new requests to a node; --wait until in-flight reaches zero.
    Drain(ops::drain::DrainArgs),
    /// Let clients send requests to a drained node again.
    Undrain(ops::drain::UndrainArgs),
    /// Restart one worker of a node now.
    Restart(ops::restart::RestartArgs),
    /// How many nodes a service needs: each node's busy ratio, and the
    /// recommended count by ceil(busy / target × nodes) with up/down windows.
    Scale(ops::scale::ScaleArgs),
    /// Print the version.
    Version {
        /// As one JSON object (`{"name": "infermesh", "version": "..."}`).
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script, e.g.
    /// `infermesh completions bash > /etc/bash_completion.d/infermesh`.
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Run a worker command for the agent so it dies with the agent (internal).
    #[command(hide = true)]
    WorkerShim(shim::ShimArgs),
}

/// The agent's hot path allocates small buffers per request (HTTP/2 frames,
/// header maps); mimalloc serves them faster than glibc's malloc
/// (BENCHMARKS.md, "Agent hop").
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // Usage errors exit 64 (sysexits' EX_USAGE), not clap's 2; --help and
    // --version print to stdout and exit 0.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    let code = match cli.command {
        Command::Agent(args) => agent_cmd::main(args),
        Command::Bench(args) => bench::main(args),
        Command::Demo(args) => demo::main(args),
        Command::Drill(args) => drill::main(args),
        Command::Nodes(args) => ops::nodes::main(args),
        Command::Status(args) => ops::status::main(args),
        Command::Health(args) => ops::health::main(args),
        Command::Drain(args) => ops::drain::main(args),
        Command::Undrain(args) => ops::drain::undrain_main(args),
        Command::Restart(args) => ops::restart::main(args),
        Command::Scale(args) => ops::scale::main(args),
        Command::WorkerShim(args) => shim::main(args),
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "infermesh",
                &mut std::io::stdout(),
            );
            exit::OK
        }
        Command::Version { json } => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "name": "infermesh", "version": env!("CARGO_PKG_VERSION") })
                );
            } else {
                println!("infermesh {}", env!("CARGO_PKG_VERSION"));
            }
            exit::OK
        }
    };
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One spelling for the admin token file across the agent and the CLI;
    /// the earlier `--token-file` still parses.
    #[test]
    fn the_admin_token_file_flag_is_spelled_like_the_agents() {
        let flags = ["--admin-token-file", "--token-file"]; // earlier spelling: still read
        for flag in flags {
            let cli =
                Cli::try_parse_from(["infermesh", "drain", "n1", "--admin", "h:1", flag, "/t"])
                    .unwrap_or_else(|e| panic!("{flag}: {e}"));
            let Command::Drain(args) = cli.command else {
                panic!("not drain");
            };
            assert_eq!(
                args.node.admin_token_file.as_deref(),
                Some(std::path::Path::new("/t"))
            );
        }
    }
}
