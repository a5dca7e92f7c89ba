//! `[[tenants]]`: who the node's models belong to, and what each owner is
//! guaranteed when the node is contended (see [`crate::dispatch::tenant`] for how
//! dispatch uses it).
//!
//! ```toml
//! [[tenants]]
//! name = "search"        # letters, digits, '-', '_', '.'
//! models = ["ranker"]    # a model belongs to at most one tenant
//! priority = 1           # smaller is more important (Triton's convention); default 10
//! share = 0.6            # of the node's worker slots, guaranteed while it has work
//! rate = 500             # optional: requests/s admitted (1 s burst); more: RESOURCE_EXHAUSTED
//! default_request_priority = 10  # what a request without Triton's `priority` counts as
//! ```
//!
//! Models in no tenant belong to the tenant `default` (priority 10, the
//! share the others leave); naming a tenant `default` without models
//! configures it. Without `[[tenants]]` every model is `default`'s, with the
//! whole node: dispatch is plain FIFO, as before tenants existed.

use std::collections::HashMap;

use serde::Deserialize;

/// The name of the tenant of models no tenant lists.
pub const DEFAULT_TENANT: &str = "default";

/// Priority of a tenant that does not give one (and of `default`).
pub const DEFAULT_PRIORITY: u32 = 10;

/// The level of a request without Triton's `priority` parameter (or with
/// 0), unless its tenant says otherwise.
pub const DEFAULT_REQUEST_PRIORITY: u64 = 10;

/// Most tenants one node has (they are metric labels).
pub const MAX_TENANTS: usize = 64;

/// `[[tenants]]` as written.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenant {
    /// Its name (metric label, errors).
    pub name: String,
    /// Models it owns.
    #[serde(default)]
    pub models: Vec<String>,
    /// Smaller is more important; at least 1. Default [`DEFAULT_PRIORITY`].
    pub priority: Option<u32>,
    /// Share of the node's worker slots it is guaranteed, in [0, 1].
    pub share: Option<f64>,
    /// Requests per second admitted, if limited.
    pub rate: Option<f64>,
    /// The level of its requests without a `priority` parameter; at least 1.
    /// Default [`DEFAULT_REQUEST_PRIORITY`].
    pub default_request_priority: Option<u64>,
}

/// One checked tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantSpec {
    /// Its name.
    pub name: String,
    /// Models it owns.
    pub models: Vec<String>,
    /// Smaller is more important.
    pub priority: u32,
    /// Share of the node's worker slots guaranteed while it has work.
    pub share: f64,
    /// Requests per second admitted, if limited.
    pub rate: Option<f64>,
    /// The level of its requests without a `priority` parameter (or 0).
    pub default_request_priority: u64,
}

impl TenantSpec {
    /// The tenant every model belongs to when none is configured.
    pub fn whole_node() -> Self {
        TenantSpec {
            name: DEFAULT_TENANT.into(),
            models: Vec::new(),
            priority: DEFAULT_PRIORITY,
            share: 1.0,
            rate: None,
            default_request_priority: DEFAULT_REQUEST_PRIORITY,
        }
    }
}

/// Checks `[[tenants]]`, adding the `default` tenant (last) unless it is
/// configured. Problems go to `problems`.
pub fn tenants(raw: &[RawTenant], problems: &mut Vec<String>) -> Vec<TenantSpec> {
    if raw.len() > MAX_TENANTS {
        problems.push(format!(
            "tenants: {} tenants (at most {MAX_TENANTS})",
            raw.len()
        ));
    }
    let mut out: Vec<TenantSpec> = Vec::new();
    let mut owner: HashMap<&str, &str> = HashMap::new();
    for (i, t) in raw.iter().enumerate() {
        let at = format!("tenants[{i}] ({})", t.name.escape_debug());
        if t.name.is_empty()
            || t.name.len() > 64
            || !t
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            problems.push(format!(
                "{at}: name must be 1-64 letters, digits, '-', '_' or '.'"
            ));
        }
        if out.iter().any(|o| o.name == t.name) {
            problems.push(format!("{at}: duplicate tenant name"));
        }
        if t.name == DEFAULT_TENANT && !t.models.is_empty() {
            problems.push(format!(
                "{at}: `{DEFAULT_TENANT}` owns the models no tenant lists; give it no models"
            ));
        }
        for m in &t.models {
            if m.is_empty() {
                problems.push(format!("{at}: empty model name"));
            } else if let Some(other) = owner.insert(m, &t.name) {
                problems.push(format!(
                    "{at}: model '{}' already belongs to tenant '{other}'",
                    m.escape_debug()
                ));
            }
        }
        let priority = t.priority.unwrap_or(DEFAULT_PRIORITY);
        if priority == 0 {
            problems.push(format!(
                "{at}: priority must be at least 1 (1 is the most important)"
            ));
        }
        let share = t.share.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&share) {
            problems.push(format!("{at}: share {share} must be between 0 and 1"));
        }
        if let Some(r) = t.rate {
            if !(r.is_finite() && r > 0.0) {
                problems.push(format!(
                    "{at}: rate {r} must be a positive number of requests per second"
                ));
            }
        }
        let default_request_priority = t
            .default_request_priority
            .unwrap_or(DEFAULT_REQUEST_PRIORITY);
        if default_request_priority == 0 {
            problems.push(format!(
                "{at}: default_request_priority must be at least 1 (Triton's levels start at 1)"
            ));
        }
        out.push(TenantSpec {
            default_request_priority,
            name: t.name.clone(),
            models: t.models.clone(),
            priority,
            share: if t.share.is_none() && t.name == DEFAULT_TENANT {
                f64::NAN
            } else {
                share
            },
            rate: t.rate,
        });
    }
    let given: f64 = out.iter().map(|t| t.share).filter(|s| s.is_finite()).sum();
    if given > 1.0 + 1e-9 {
        problems.push(format!(
            "tenants: shares add up to {given:.3}, more than the whole node (1)"
        ));
    }
    let rest = (1.0 - given).max(0.0);
    match out.iter_mut().find(|t| t.name == DEFAULT_TENANT) {
        Some(d) if d.share.is_nan() => d.share = rest,
        Some(_) => {}
        None => out.push(TenantSpec {
            share: if raw.is_empty() { 1.0 } else { rest },
            ..TenantSpec::whole_node()
        }),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(toml: &str) -> Result<Vec<TenantSpec>, String> {
        #[derive(Deserialize)]
        struct File {
            #[serde(default)]
            tenants: Vec<RawTenant>,
        }
        let raw: File = toml::from_str(toml).map_err(|e| e.to_string())?;
        let mut problems = Vec::new();
        let t = tenants(&raw.tenants, &mut problems);
        if problems.is_empty() {
            Ok(t)
        } else {
            Err(problems.join("\n"))
        }
    }

    #[test]
    fn none_configured_is_one_tenant_with_the_whole_node() {
        assert_eq!(check("").unwrap(), vec![TenantSpec::whole_node()]);
    }

    #[test]
    fn default_gets_what_the_others_leave() {
        let t = check(
            "[[tenants]]\nname = \"search\"\nmodels = [\"a\"]\npriority = 1\nshare = 0.6\nrate = 50\n\
             [[tenants]]\nname = \"batch\"\nmodels = [\"b\", \"c\"]\npriority = 20\nshare = 0.1\n",
        )
        .unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!((t[0].priority, t[0].share, t[0].rate), (1, 0.6, Some(50.0)));
        assert_eq!((t[1].priority, t[1].share, t[1].rate), (20, 0.1, None));
        assert_eq!(t[2].name, DEFAULT_TENANT);
        assert!((t[2].share - 0.3).abs() < 1e-9);
        // Naming `default` configures it.
        let t = check(
            "[[tenants]]\nname = \"default\"\npriority = 30\n\
             [[tenants]]\nname = \"search\"\nmodels = [\"a\"]\nshare = 0.5\n",
        )
        .unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].priority, t[0].share), (30, 0.5));
    }

    #[test]
    fn every_problem_is_reported() {
        let err = check(
            "[[tenants]]\nname = \"a b\"\nmodels = [\"m\", \"\"]\npriority = 0\nshare = 1.5\nrate = -1\ndefault_request_priority = 0\n\
             [[tenants]]\nname = \"x\"\nmodels = [\"m\"]\nshare = 0.5\n\
             [[tenants]]\nname = \"x\"\n\
             [[tenants]]\nname = \"default\"\nmodels = [\"n\"]\n",
        )
        .unwrap_err();
        for needle in [
            "name must be",
            "empty model name",
            "priority must be at least 1",
            "default_request_priority must be at least 1",
            "share 1.5",
            "rate -1",
            "already belongs to tenant 'a b'",
            "duplicate tenant name",
            "give it no models",
            "shares add up to 2.000",
        ] {
            assert!(err.contains(needle), "missing '{needle}' in {err}");
        }
        assert!(check("[[tenants]]\nname = \"a\"\nweight = 1\n").is_err());
    }
}
