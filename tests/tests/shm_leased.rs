//! Zero-copy shared memory (issue 27): a caller leases a region of the
//! client library's pool, builds its inputs there, and reads the outputs
//! where the worker wrote them. Against a real agent and test worker
//! (`identity`): the answer is right, it took shared memory, a view that
//! outlives its call keeps its region from reuse and dropping it releases
//! it; to a node that is not local the same leased request goes inline.

use infermesh_client::{Client, OutputSpec, TensorSpec};
use infermesh_tests::{Agent, testworker};
use infermesh_transport::Path;
use infermesh_transport::shm::elements;

async fn client(agent: &Agent, local: bool) -> Client {
    let mut b = Client::builder().registry(format!("static://{}", agent.oip));
    if local {
        b = b.local_node(agent.oip.to_string());
    }
    b.build().await.unwrap()
}

/// A leased identity call on `rows` × 1024 FP32 filled with `value`.
async fn leased_call(client: &Client, rows: i64, value: f32) -> infermesh_client::Answered {
    let mut req = client
        .lease(
            "identity",
            &[TensorSpec::of::<f32>("INPUT0", &[rows, 1024])],
            &[OutputSpec::new("OUTPUT0")],
        )
        .unwrap();
    req.input_as::<f32>(0).unwrap().fill(value);
    client.infer_leased(req).await.unwrap()
}

#[tokio::test]
async fn a_leased_call_is_answered_in_place_and_its_view_holds_the_region() {
    let agent = Agent::builder()
        .worker(testworker("--model identity"))
        .start()
        .await;
    let client = client(&agent, true).await;
    let pool = client.shm_pool().clone();

    let first = leased_call(&client, 64, 1.5).await;
    assert_eq!(first.path, Some(Path::Shm));
    let out = first.response.raw_output_contents[0].clone();
    assert_eq!(elements::<f32>(&out).unwrap(), vec![1.5f32; 64 * 1024]);
    drop(first);
    assert_eq!(
        pool.counters().leased,
        1,
        "the output outlives its call: its region stays leased"
    );

    let second = leased_call(&client, 64, -2.0).await;
    assert_eq!(
        pool.counters().created,
        2,
        "a call while the view lives gets another region"
    );
    assert_eq!(
        elements::<f32>(&out).unwrap()[..4],
        [1.5; 4],
        "the first view still reads its own answer"
    );
    assert_eq!(
        elements::<f32>(&second.response.raw_output_contents[0]).unwrap()[..4],
        [-2.0; 4]
    );
    drop((out, second));
    assert_eq!(pool.counters().leased, 0, "dropped: released");

    let third = leased_call(&client, 64, 3.0).await;
    assert_eq!(
        elements::<f32>(&third.response.raw_output_contents[0]).unwrap()[..4],
        [3.0; 4]
    );
    let c = pool.counters();
    assert_eq!(
        (c.created, c.reused),
        (2, 1),
        "a released region is lent again"
    );
}

#[tokio::test]
async fn a_leased_call_to_a_remote_node_goes_inline() {
    let agent = Agent::builder()
        .worker(testworker("--model identity"))
        .start()
        .await;
    let client = client(&agent, false).await;
    let answered = leased_call(&client, 16, 0.25).await;
    assert_eq!(answered.path, Some(Path::Grpc));
    assert_eq!(
        elements::<f32>(&answered.response.raw_output_contents[0]).unwrap(),
        vec![0.25f32; 16 * 1024]
    );
}

#[tokio::test]
async fn a_leased_request_is_checked() {
    let agent = Agent::builder()
        .worker(testworker("--model identity"))
        .start()
        .await;
    let client = client(&agent, true).await;
    let bad = client.lease(
        "identity",
        &[TensorSpec::of::<f32>("INPUT0", &[-1, 4])],
        &[],
    );
    assert_eq!(bad.unwrap_err().code(), tonic::Code::InvalidArgument);
    let mut req = client
        .lease(
            "identity",
            &[TensorSpec::of::<f32>("INPUT0", &[2, 4])],
            &[OutputSpec::new("OUTPUT0")],
        )
        .unwrap();
    assert!(req.input_as::<i32>(0).is_err(), "FP32 is not read as i32");
    assert!(req.input(1).is_err(), "one input");
    assert_eq!(req.input(0).unwrap().len(), 32);
}
