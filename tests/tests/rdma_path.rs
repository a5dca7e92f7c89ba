//! The RDMA path end to end over the emulation: an agent with
//! `[transport] rdma = "emulated"` and a client-side `RdmaPath` move dense
//! tensors by RDMA READ/WRITE and get exactly the model's results; the agent
//! counts them as `path="rdma"` and advertises the path; bad descriptors,
//! someone else's queue pair and a too-small output buffer are refused
//! before anything is written; a broken link is reported as `PathBroken`
//! without hurting the agent, and once restored a new queue pair works.

use std::time::Duration;

use infermesh_client::{RdmaPath, RdmaPathError};
use infermesh_proto::GrpcInferenceServiceClient;
use infermesh_proto::inference::infer_parameter::ParameterChoice;
use infermesh_proto::inference::model_infer_request::InferRequestedOutputTensor;
use infermesh_proto::inference::{InferParameter, ModelInferRequest};
use infermesh_proto::rdma::{
    ConnectRequest, INPUT_PARAM, OUTPUT_PARAM, QPN_PARAM, RdmaClient, UNKNOWN_QP_PREFIX,
};
use infermesh_proto::registry::{NodeRecord, node_path};
use infermesh_proto::tensor::f32_to_raw;
use infermesh_rdma::{Access, Connection, EndpointInfo, RdmaEngine, RdmaError};
use infermesh_tests::zk::Zk;
use infermesh_tests::{Agent, Load, dense, eventually, testworker};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const TIMEOUT: Duration = Duration::from_secs(20);

async fn rdma_agent() -> Agent {
    Agent::builder()
        .config("[transport]\nrdma = \"emulated\"\n")
        .worker(testworker(""))
        .start()
        .await
}

async fn channel(agent: &Agent) -> Channel {
    Endpoint::from_shared(format!("http://{}", agent.oip))
        .unwrap()
        .connect()
        .await
        .expect("connect to agent")
}

/// A raw dense request that lists its output, as the RDMA path needs.
fn request(input: &[f32]) -> ModelInferRequest {
    let mut req = dense::request(input, true);
    req.outputs = vec![InferRequestedOutputTensor {
        name: "OUTPUT0".into(),
        ..Default::default()
    }];
    req
}

fn param(choice: ParameterChoice) -> InferParameter {
    InferParameter {
        parameter_choice: Some(choice),
    }
}

/// A queue pair to the agent on `ch`, set up by hand.
async fn connect(engine: &RdmaEngine, peer: &str, ch: &Channel) -> Connection {
    let ch = ch.clone();
    engine
        .connect(peer, |local: EndpointInfo| async move {
            let resp = RdmaClient::new(ch)
                .connect_queue_pair(ConnectRequest {
                    endpoint: local.encode(),
                })
                .await
                .map_err(|s| RdmaError::Connect(s.message().to_string()))?;
            EndpointInfo::decode(&resp.into_inner().endpoint)
        })
        .await
        .expect("queue pair to the agent")
}

#[tokio::test]
async fn dense_requests_go_over_rdma_with_exact_results() {
    let agent = rdma_agent().await;
    let path = RdmaPath::new(RdmaEngine::emulated().await.unwrap());
    let ch = channel(&agent).await;
    let sizes = [1, 3, 64, 2048];
    for (seed, rows) in sizes.into_iter().enumerate() {
        let input = dense::input(rows, seed as u32);
        let resp = path
            .infer("agent-a", ch.clone(), request(&input), TIMEOUT)
            .await
            .unwrap()
            .into_inner();
        let (out, raw) = dense::output(&resp);
        assert!(raw, "outputs come back as raw contents");
        assert_eq!(out, dense::forward(&input), "{rows} rows");
        assert_eq!(resp.outputs[0].shape, vec![rows as i64, 4]);
        assert!(
            resp.outputs[0].parameters.is_empty(),
            "RDMA bookkeeping is not shown to the caller"
        );
    }
    let m = agent.metrics().await;
    assert!(
        m.contains(&format!(
            "infermesh_transport_requests_total{{path=\"rdma\"}} {}",
            sizes.len()
        )),
        "{m}"
    );
    // Every path's series exists from the start; none went inline.
    assert!(
        m.contains("infermesh_transport_requests_total{path=\"grpc\"} 0"),
        "nothing went inline: {m}"
    );

    // Requests the path cannot take are left to the caller.
    let mut no_outputs = request(&dense::input(1, 9));
    no_outputs.outputs.clear();
    let err = path
        .infer("agent-a", ch.clone(), no_outputs, TIMEOUT)
        .await
        .unwrap_err();
    assert!(matches!(err, RdmaPathError::NotApplicable(_)), "{err:?}");
}

#[tokio::test]
async fn a_broken_link_is_path_broken_and_a_new_queue_pair_works_after() {
    let agent = rdma_agent().await;
    let engine = RdmaEngine::emulated().await.unwrap();
    let path = RdmaPath::new(engine.clone());
    let ch = channel(&agent).await;
    let input = dense::input(4, 5);
    let ok = path
        .infer("agent-a", ch.clone(), request(&input), TIMEOUT)
        .await
        .unwrap();
    assert_eq!(dense::output(ok.get_ref()).0, dense::forward(&input));

    let faults = engine.faults().expect("emulated engine");
    faults.break_link();
    for _ in 0..2 {
        let err = path
            .infer("agent-a", ch.clone(), request(&input), TIMEOUT)
            .await
            .unwrap_err();
        assert!(matches!(err, RdmaPathError::PathBroken(_)), "{err:?}");
    }
    // The agent is fine and still serves inline.
    let resp = agent
        .client()
        .await
        .model_infer(dense::request(&input, true))
        .await
        .expect("inline request after the RDMA failure")
        .into_inner();
    assert_eq!(dense::output(&resp).0, dense::forward(&input));

    faults.restore();
    let resp = path
        .infer("agent-a", ch.clone(), request(&input), TIMEOUT)
        .await
        .expect("a new queue pair after restore")
        .into_inner();
    assert_eq!(dense::output(&resp).0, dense::forward(&input));
    let m = agent.metrics().await;
    assert!(m.contains("path=\"rdma\"} 2"), "{m}");
}

#[tokio::test]
async fn a_stalled_link_runs_into_the_deadline_and_recovers() {
    let agent = rdma_agent().await;
    let engine = RdmaEngine::emulated().await.unwrap();
    let path = RdmaPath::new(engine.clone());
    let ch = channel(&agent).await;
    let input = dense::input(2, 6);
    path.infer("agent-a", ch.clone(), request(&input), TIMEOUT)
        .await
        .unwrap();

    let faults = engine.faults().expect("emulated engine");
    faults.stall();
    let err = path
        .infer(
            "agent-a",
            ch.clone(),
            request(&input),
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
    match err {
        // tonic reports its own timeout as CANCELLED "Timeout expired".
        RdmaPathError::Status(s) => assert!(
            matches!(s.code(), Code::DeadlineExceeded | Code::Cancelled),
            "{s:?}"
        ),
        other => panic!("expected a deadline, got {other:?}"),
    }
    faults.restore();
    // The agent may still finish its stalled READ against the revoked
    // buffer, which breaks that queue pair: at most one broken call, then
    // a new queue pair serves.
    let mut broken = 0;
    let resp = loop {
        match path
            .infer("agent-a", ch.clone(), request(&input), TIMEOUT)
            .await
        {
            Ok(resp) => break resp.into_inner(),
            Err(RdmaPathError::PathBroken(why)) if broken == 0 => {
                broken += 1;
                eprintln!("one broken call after the stall: {why}");
            }
            Err(e) => panic!("no recovery after the stall: {e:?}"),
        }
    };
    assert_eq!(dense::output(&resp).0, dense::forward(&input));
}

#[tokio::test]
async fn the_agent_refuses_bad_rdma_requests_before_moving_anything() {
    let agent = rdma_agent().await;
    let engine = RdmaEngine::emulated().await.unwrap();
    let ch = channel(&agent).await;
    let mut oip = GrpcInferenceServiceClient::new(ch.clone());
    let conn = connect(&engine, "agent-a", &ch).await;
    let qpn = i64::from(conn.peer_info().qpn());
    let input = dense::input(2, 7);
    let bytes = f32_to_raw(&input);
    let mut in_buf = engine
        .register(bytes.len(), Access::RemoteRead)
        .await
        .unwrap();
    in_buf.as_mut_slice().copy_from_slice(&bytes);
    // Room for one of the two output rows (16 bytes each).
    let mut out_buf = engine.register(16, Access::RemoteWrite).await.unwrap();
    out_buf.as_mut_slice().fill(0xab);
    let build = |input_desc: &str, output_desc: &str, qpn: i64| {
        let mut req = request(&input);
        req.raw_input_contents.clear();
        req.parameters
            .insert(QPN_PARAM.into(), param(ParameterChoice::Int64Param(qpn)));
        req.inputs[0].parameters.insert(
            INPUT_PARAM.into(),
            param(ParameterChoice::StringParam(input_desc.into())),
        );
        req.outputs[0].parameters.insert(
            OUTPUT_PARAM.into(),
            param(ParameterChoice::StringParam(output_desc.into())),
        );
        req
    };
    let (good_in, small_out) = (
        in_buf.remote().to_param_string(),
        out_buf.remote().to_param_string(),
    );

    let malformed = oip
        .model_infer(build("0x10:40:7", &small_out, qpn))
        .await
        .unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument, "{malformed:?}");
    assert!(
        malformed.message().starts_with("rdma: input 'INPUT0'"),
        "{malformed:?}"
    );

    let too_small = oip
        .model_infer(build(&good_in, &small_out, qpn))
        .await
        .unwrap_err();
    assert_eq!(too_small.code(), Code::InvalidArgument, "{too_small:?}");
    assert!(
        too_small.message().starts_with("rdma: output too large"),
        "{too_small:?}"
    );
    assert!(
        out_buf.as_slice().iter().all(|b| *b == 0xab),
        "nothing was written"
    );

    // The queue pair belongs to the connection that set it up.
    let mut other = agent.client().await;
    let foreign = other
        .model_infer(build(&good_in, &small_out, qpn))
        .await
        .unwrap_err();
    assert_eq!(foreign.code(), Code::InvalidArgument, "{foreign:?}");
    assert!(
        foreign.message().starts_with(UNKNOWN_QP_PREFIX),
        "{foreign:?}"
    );

    // The agent lives on, and the connection's own queue pair still works.
    let big_out = engine.register(1024, Access::RemoteWrite).await.unwrap();
    let resp = oip
        .model_infer(build(&good_in, &big_out.remote().to_param_string(), qpn))
        .await
        .unwrap()
        .into_inner();
    let written = &resp.outputs[0].parameters["infermesh_rdma_bytes"];
    assert_eq!(
        written.parameter_choice,
        Some(ParameterChoice::Int64Param(32))
    );
    assert!(
        resp.raw_output_contents[0].is_empty(),
        "the bytes came by RDMA"
    );
    let out = infermesh_proto::tensor::raw_to_f32(&big_out.as_slice()[..32]).unwrap();
    assert_eq!(out, dense::forward(&input));
}

#[tokio::test]
async fn the_record_advertises_the_rdma_path() {
    let zk = Zk::start().await;
    let _agent = Agent::builder()
        .config(format!(
            "node_id = \"rdma-a\"\n[transport]\nrdma = \"emulated\"\n\
             [registry]\nurl = \"{}\"\nservice = \"eta\"\nsession_timeout = \"2s\"\n",
            zk.url("/infermesh")
        ))
        .worker(testworker(""))
        .start()
        .await;
    let c = zookeeper_client::Client::connect(&format!("{}/infermesh", zk.address()))
        .await
        .unwrap();
    let record = eventually("record written", || async {
        let (data, _) = c.get_data(&node_path("eta", "rdma-a")).await.ok()?;
        NodeRecord::from_json(&data, "rdma-a").ok()
    })
    .await;
    assert_eq!(record.endpoints.rdma.as_deref(), Some("emulated"));
}

/// Through the client library: requests to a node that advertises RDMA take
/// the RDMA path; breaking the link mid-stream re-sends the affected requests
/// inline, and not one request fails.
#[tokio::test]
async fn a_forced_rdma_failure_mid_stream_resends_on_grpc_without_failures() {
    use infermesh_client::{Client, PathsConfig};
    use infermesh_transport::Path;

    let zk = Zk::start().await;
    let _agent = Agent::builder()
        .config(format!(
            "node_id = \"rdma-b\"\n[transport]\nrdma = \"emulated\"\n\
             [registry]\nurl = \"{}\"\nservice = \"eta\"\nsession_timeout = \"2s\"\n",
            zk.url("/infermesh")
        ))
        .worker(testworker(""))
        .start()
        .await;
    let engine = RdmaEngine::emulated().await.unwrap();
    let client = Client::builder()
        .registry(zk.url("/infermesh"))
        .service("eta")
        .transports(PathsConfig {
            rdma: Some(engine.clone()),
            ..Default::default()
        })
        .build()
        .await
        .unwrap();
    eventually("the client sees the node", || async {
        (client.nodes().len() == 1).then_some(())
    })
    .await;
    let load = Load::start(&client, 3, 4, request);
    eventually("requests go over RDMA", || async {
        (client.path_counters().get(Path::Rdma).successes >= 20).then_some(())
    })
    .await;
    engine.faults().unwrap().break_link();
    let at_break = load.sent();
    eventually("requests continue inline after the break", || async {
        let grpc = client.path_counters().get(Path::Grpc).successes;
        (grpc >= 20 && load.sent() > at_break + 20).then_some(())
    })
    .await;
    let failed = load.stop().await;
    let rdma = client.path_counters().get(Path::Rdma);
    assert!(rdma.failures >= 1, "{rdma:?}");
    assert_eq!(failed, 0, "failed requests");
}
