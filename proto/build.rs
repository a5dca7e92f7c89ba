//! Compiles the project's `.proto` files with the pure-Rust `protox` compiler,
//! so no `protoc` is needed on any machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/inference/grpc_service.proto",
        "proto/inference/model_config.proto",
        "proto/infermesh/v1/admin.proto",
        "proto/infermesh/v1/rdma.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        // Tensor payloads stay `Bytes`, so the agent forwards them without copying.
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .generate_default_stubs(true)
        .compile_fds(fds)?;
    Ok(())
}
