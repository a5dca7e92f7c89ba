//! The Kubernetes manifests in `configs/k8s/` agree with each other and with
//! the code: every document is a well-formed object, the DaemonSet's probes,
//! ports and preStop hook match the `agent.toml` it mounts, that `agent.toml`
//! passes the agent's own config checks, every Secret, ConfigMap key and
//! `$(VAR)` the pod uses exists, and the example client config parses.
//!
//! YAML is read with `yaml_serde`: the YAML organization's maintained
//! continuation of `serde_yaml` (archived in 2024), with the same API —
//! multi-document streams straight into `serde_json::Value`. The other forks
//! (`serde_yaml_ng`, `serde_norway`) see less maintenance, and `serde-saphyr`
//! needs a newer Rust than the workspace's minimum.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use infermesh_agent::{AgentConfig, RawConfig};
use infermesh_proto::registry::RegistryUrl;
use serde::Deserialize;
use serde_json::Value;

/// One YAML document and the file it came from.
struct Doc {
    file: String,
    value: Value,
}

fn docs() -> Vec<Doc> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/k8s");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML in {}", dir.display());
    let mut docs = Vec::new();
    for path in files {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        let before = docs.len();
        for de in yaml_serde::Deserializer::from_str(&text) {
            let value = Value::deserialize(de).unwrap_or_else(|e| panic!("{file}: {e}"));
            if !value.is_null() {
                docs.push(Doc {
                    file: file.clone(),
                    value,
                });
            }
        }
        assert!(docs.len() > before, "{file} holds no document");
    }
    docs
}

fn text<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no string at {pointer} in {v}"))
}

fn list<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn strings(v: &Value, pointer: &str) -> Vec<String> {
    list(v, pointer)
        .iter()
        .map(|s| s.as_str().expect("a list of strings").to_string())
        .collect()
}

fn find<'a>(docs: &'a [Doc], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .map(|d| &d.value)
        .find(|v| v["kind"] == kind && v["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} named {name} in configs/k8s"))
}

fn daemonset(docs: &[Doc]) -> &Value {
    find(docs, "DaemonSet", "infermesh-agent")
}

fn agent_container(ds: &Value) -> &Value {
    list(ds, "/spec/template/spec/containers")
        .iter()
        .find(|c| c["name"] == "agent")
        .expect("a container named agent")
}

/// The value after `flag` in `argv`.
fn flag<'a>(argv: &'a [String], flag: &str) -> Option<&'a str> {
    let i = argv.iter().position(|a| a == flag)?;
    argv.get(i + 1).map(String::as_str)
}

/// A ConfigMap or Secret key's value (`data` or `stringData`).
fn key<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    ["data", "stringData"]
        .iter()
        .find_map(|section| obj[section][key].as_str())
}

/// The container's environment as a node would see it: downward-API fields
/// get sample values, ConfigMap keys their value (missing ones fail).
fn environment(docs: &[Doc], container: &Value) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for e in list(container, "/env") {
        let name = text(e, "/name").to_string();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_string()
        } else if let Some(field) = e.pointer("/valueFrom/fieldRef/fieldPath") {
            match field.as_str().unwrap() {
                "spec.nodeName" => "gpu-node-1".into(),
                "status.hostIP" | "status.podIP" => "10.0.0.7".into(),
                other => format!("<{other}>"),
            }
        } else if let Some(r) = e.pointer("/valueFrom/configMapKeyRef") {
            let (cm, k) = (text(r, "/name"), text(r, "/key"));
            key(find(docs, "ConfigMap", cm), k)
                .unwrap_or_else(|| panic!("env {name}: ConfigMap {cm} has no key {k}"))
                .to_string()
        } else if let Some(r) = e.pointer("/valueFrom/secretKeyRef") {
            let (s, k) = (text(r, "/name"), text(r, "/key"));
            key(find(docs, "Secret", s), k)
                .unwrap_or_else(|| panic!("env {name}: Secret {s} has no key {k}"))
                .to_string()
        } else {
            panic!("env {name}: no value I know how to read");
        };
        env.insert(name, value);
    }
    env
}

/// Expands `$(VAR)` as the kubelet does; an unknown variable fails (the
/// kubelet would leave it in the argument as is, silently).
fn expand(arg: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = arg;
    while let Some(i) = rest.find("$(") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find(')').expect("closed $(") + i;
        let var = &rest[i + 2..end];
        out.push_str(
            env.get(var)
                .unwrap_or_else(|| panic!("'{arg}' uses $({var}), not in env")),
        );
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The agent's command line after expansion.
fn agent_argv(docs: &[Doc]) -> Vec<String> {
    let c = agent_container(daemonset(docs));
    let env = environment(docs, c);
    let mut argv = strings(c, "/command");
    argv.extend(strings(c, "/args"));
    argv.iter().map(|a| expand(a, &env)).collect()
}

/// Where volume `volume` (item `key`) is mounted in the agent container.
fn mounted_file(ds: &Value, volume: &str, key: &str) -> String {
    let v = list(ds, "/spec/template/spec/volumes")
        .iter()
        .find(|v| v["name"] == volume)
        .unwrap_or_else(|| panic!("no volume {volume}"));
    let source = v
        .get("configMap")
        .or_else(|| v.get("secret"))
        .expect("a ConfigMap or Secret volume");
    let path = list(source, "/items")
        .iter()
        .find(|i| i["key"] == key)
        .map(|i| text(i, "/path").to_string())
        .unwrap_or_else(|| key.to_string());
    let mount = list(agent_container(ds), "/volumeMounts")
        .iter()
        .find(|m| m["name"] == volume)
        .unwrap_or_else(|| panic!("volume {volume} is not mounted"));
    format!("{}/{path}", text(mount, "/mountPath").trim_end_matches('/'))
}

/// The embedded agent.toml, checked by the agent's parser with the
/// DaemonSet's flags applied as the CLI applies them.
fn agent_config(docs: &[Doc]) -> AgentConfig {
    let ds = daemonset(docs);
    let argv = agent_argv(docs);
    let path = flag(&argv, "--config").expect("--config");
    let volume = list(ds, "/spec/template/spec/volumes")
        .iter()
        .find(|v| {
            v.get("configMap").is_some() && mounted_file(ds, text(v, "/name"), "agent.toml") == path
        })
        .unwrap_or_else(|| panic!("--config {path} is not a mounted ConfigMap key"));
    let cm = find(docs, "ConfigMap", text(volume, "/configMap/name"));
    let toml = key(cm, "agent.toml").expect("agent.toml in the ConfigMap");
    let mut raw = RawConfig::from_toml(toml).unwrap_or_else(|e| panic!("embedded agent.toml: {e}"));
    if let Some(v) = flag(&argv, "--node-id") {
        raw.node_id = Some(v.into());
    }
    if let Some(v) = flag(&argv, "--listen") {
        raw.listen = Some(v.into());
    }
    if let Some(v) = flag(&argv, "--admin-listen") {
        raw.admin_listen = Some(v.into());
    }
    if let Some(v) = flag(&argv, "--registry") {
        raw.registry.url = Some(v.into());
    }
    AgentConfig::from_raw(raw).unwrap_or_else(|e| panic!("embedded agent.toml: {e}"))
}

/// A probe's or endpoint's port: a number, or a container port's name.
fn port_number(container: &Value, port: &Value) -> u16 {
    if let Some(n) = port.as_u64() {
        return n as u16;
    }
    let name = port.as_str().expect("port is a number or a name");
    list(container, "/ports")
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_u64())
        .unwrap_or_else(|| panic!("no container port named {name}")) as u16
}

#[test]
fn every_document_names_its_api_kind_and_name() {
    let docs = docs();
    let namespaces: Vec<&str> = docs
        .iter()
        .filter(|d| d.value["kind"] == "Namespace")
        .map(|d| text(&d.value, "/metadata/name"))
        .collect();
    assert_eq!(namespaces.len(), 1, "one Namespace document");
    for d in &docs {
        for field in ["/apiVersion", "/kind", "/metadata/name"] {
            let v = d.value.pointer(field).and_then(Value::as_str);
            assert!(
                v.is_some_and(|s| !s.is_empty()),
                "{}: a document without {field}",
                d.file
            );
        }
        if d.value["kind"] != "Namespace" {
            assert_eq!(
                d.value["metadata"]["namespace"], namespaces[0],
                "{}: {} is not in namespace {}",
                d.file, d.value["metadata"]["name"], namespaces[0]
            );
        }
    }
}

#[test]
fn daemonset_selector_matches_its_pods() {
    let docs = docs();
    let ds = daemonset(&docs);
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    let selector = ds["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("selector.matchLabels");
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(
            &labels[k], v,
            "selector {k}={v} does not match the pod labels"
        );
    }
    let c = agent_container(ds);
    assert!(!text(c, "/image").is_empty());
    assert_eq!(strings(c, "/command")[..2], ["infermesh", "agent"]);
}

#[test]
fn embedded_agent_toml_passes_the_agents_checks() {
    let docs = docs();
    let cfg = agent_config(&docs);
    assert_eq!(cfg.node_id, "gpu-node-1", "--node-id $(NODE_NAME)");
    let no_host_ip = || None;
    assert_eq!(
        infermesh_agent::config::advertised(cfg.advertise, cfg.listen, no_host_ip).unwrap(),
        "10.0.0.7:8001".parse().unwrap(),
        "clients get the node's IP"
    );
    // The admin port listens on every interface; the record carries the
    // node's IP (INFERMESH_ADVERTISE_IP from status.hostIP), never 0.0.0.0.
    assert!(cfg.admin_listen.ip().is_unspecified());
    let c = agent_container(daemonset(&docs));
    let env = list(c, "/env")
        .iter()
        .find(|e| e["name"] == infermesh_agent::config::ADVERTISE_IP_ENV)
        .expect("the DaemonSet sets INFERMESH_ADVERTISE_IP");
    assert_eq!(text(env, "/valueFrom/fieldRef/fieldPath"), "status.hostIP");
    assert_eq!(
        infermesh_agent::config::advertised(cfg.admin_advertise, cfg.admin_listen, || Some(
            "10.0.0.7".parse().unwrap()
        ))
        .unwrap(),
        "10.0.0.7:8002".parse().unwrap()
    );
    assert!(cfg.registry.is_some(), "--registry $(INFERMESH_REGISTRY)");
    assert!(!cfg.workers.is_empty());
}

#[test]
fn registry_url_is_a_zookeeper_url() {
    let docs = docs();
    let url = key(find(&docs, "ConfigMap", "infermesh-registry"), "url").expect("url key");
    let parsed: RegistryUrl = url.parse().unwrap();
    assert!(parsed.zk_connect_string().is_some(), "{url} is not zk://");
}

#[test]
fn probes_and_ports_match_agent_toml() {
    let docs = docs();
    let ds = daemonset(&docs);
    let c = agent_container(ds);
    let cfg = agent_config(&docs);
    let admin = cfg.admin_listen.port();
    // Plaintext: the admin port. TLS without client certificates: the admin
    // port with `scheme: HTTPS`. mTLS: the plaintext `probe_listen` (the
    // kubelet has no client certificate).
    let (probe_port, scheme) = match &cfg.tls {
        None => (admin, "HTTP"),
        Some(t) if t.client_ca.is_none() => (admin, "HTTPS"),
        Some(t) => (
            t.probe_listen
                .expect("under mTLS the probes need tls.probe_listen")
                .port(),
            "HTTP",
        ),
    };
    for (probe, path) in [
        ("livenessProbe", "/livez"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/livez"),
    ] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(port_number(c, &get["port"]), probe_port, "{probe} port");
        assert_eq!(
            get["scheme"].as_str().unwrap_or("HTTP"),
            scheme,
            "{probe} scheme"
        );
    }
    assert_eq!(port_number(c, &"admin".into()), admin);
    assert_eq!(port_number(c, &"oip".into()), cfg.listen.port());
    let annotations = &ds["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/port"], admin.to_string());
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
}

#[test]
fn prestop_drain_fits_the_grace_period() {
    let docs = docs();
    let ds = daemonset(&docs);
    let hook = strings(agent_container(ds), "/lifecycle/preStop/exec/command");
    for word in ["infermesh", "drain", "--local", "--wait"] {
        assert!(
            hook.iter().any(|w| w == word),
            "preStop lacks {word}: {hook:?}"
        );
    }
    let drain = humantime::parse_duration(flag(&hook, "--timeout").expect("--timeout")).unwrap();
    let grace = Duration::from_secs(
        ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
            .as_u64()
            .expect("terminationGracePeriodSeconds"),
    );
    assert!(
        grace >= drain + Duration::from_secs(5),
        "{grace:?} < {drain:?} + 5s"
    );
    // After the drain, SIGTERM: in-flight requests (shutdown_grace), then
    // the workers' SIGTERM → SIGKILL. All of it before the kubelet's SIGKILL.
    let cfg = agent_config(&docs);
    let stop = cfg
        .workers
        .iter()
        .map(|w| w.stop_grace)
        .max()
        .unwrap_or_default();
    assert!(
        drain + cfg.shutdown_grace + stop < grace,
        "drain {drain:?} + shutdown_grace {:?} + stop_grace {stop:?} >= {grace:?}",
        cfg.shutdown_grace
    );
}

#[test]
fn admin_token_comes_from_the_secret() {
    let docs = docs();
    let ds = daemonset(&docs);
    let volume = list(ds, "/spec/template/spec/volumes")
        .iter()
        .find(|v| v["secret"]["secretName"] == "infermesh-admin-token")
        .expect("a volume from Secret infermesh-admin-token");
    let secret = find(&docs, "Secret", "infermesh-admin-token");
    assert!(
        key(secret, "token").is_some(),
        "the Secret has no key 'token'"
    );
    let file = mounted_file(ds, text(volume, "/name"), "token");
    let argv = agent_argv(&docs);
    assert_eq!(flag(&argv, "--admin-token-file"), Some(file.as_str()));
    let hook = strings(agent_container(ds), "/lifecycle/preStop/exec/command");
    assert_eq!(flag(&hook, "--admin-token-file"), Some(file.as_str()));
}

#[test]
fn everything_the_pod_references_exists() {
    let docs = docs();
    let ds = daemonset(&docs);
    let volumes = list(ds, "/spec/template/spec/volumes");
    for v in volumes {
        let source = if let Some(cm) = v.get("configMap") {
            find(&docs, "ConfigMap", text(cm, "/name"))
        } else if let Some(s) = v.get("secret") {
            find(&docs, "Secret", text(s, "/secretName"))
        } else {
            continue;
        };
        let spec = v.get("configMap").or_else(|| v.get("secret")).unwrap();
        for item in list(spec, "/items") {
            let k = text(item, "/key");
            assert!(key(source, k).is_some(), "volume {}: no key {k}", v["name"]);
        }
    }
    let c = agent_container(ds);
    for m in list(c, "/volumeMounts") {
        assert!(
            volumes.iter().any(|v| v["name"] == m["name"]),
            "mount of unknown volume {}",
            m["name"]
        );
    }
    // Every $(VAR) resolves and every ConfigMap key exists (panics otherwise).
    agent_argv(&docs);
}

#[test]
fn workers_fit_the_gpus_the_pod_holds() {
    let docs = docs();
    let c = agent_container(daemonset(&docs));
    let limit = &c["resources"]["limits"]["nvidia.com/gpu"];
    let gpus = limit
        .as_u64()
        .or_else(|| limit.as_str().and_then(|s| s.parse().ok()))
        .expect("limits nvidia.com/gpu");
    if let Some(request) = c["resources"]["requests"].get("nvidia.com/gpu") {
        assert_eq!(request, limit, "GPU requests must equal limits");
    }
    let cfg = agent_config(&docs);
    for w in &cfg.workers {
        let slice = w
            .gpu
            .as_ref()
            .expect("every worker on a GPU node has a gpu");
        let infermesh_agent::config::WorkerGpu::Index(gpu) = slice.device else {
            panic!(
                "worker {}: the DaemonSet's workers are pinned by index",
                w.id
            );
        };
        let gpu = u64::from(gpu);
        assert!(
            gpu < gpus,
            "worker {} uses GPU {gpu}; the pod holds {gpus}",
            w.id
        );
    }
}

#[test]
fn pod_monitor_scrapes_the_admin_port() {
    let docs = docs();
    let ds = daemonset(&docs);
    let pm = find(&docs, "PodMonitor", "infermesh-agent");
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    for (k, v) in pm["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("selector.matchLabels")
    {
        assert_eq!(
            &labels[k], v,
            "PodMonitor selector {k}={v} misses the agents"
        );
    }
    let c = agent_container(ds);
    let admin = agent_config(&docs).admin_listen.port();
    let endpoints = list(pm, "/spec/podMetricsEndpoints");
    assert!(!endpoints.is_empty());
    for e in endpoints {
        assert_eq!(port_number(c, &e["port"]), admin);
        assert_eq!(e["path"], "/metrics");
    }
}

#[test]
fn example_client_config_parses() {
    let text = include_str!("../../configs/client.toml");
    infermesh_client::config::ClientConfig::from_toml(text).unwrap();
}
