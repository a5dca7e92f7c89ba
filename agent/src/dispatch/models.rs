//! The models this node serves, each with a small id.
//!
//! Model names come from workers (configured, or asked with
//! `RepositoryIndex`) and are interned once into a [`ModelId`]: the
//! dispatcher keeps one queue per id, metrics keep one set of label handles
//! per id, and a name a client makes up never creates state anywhere. The
//! table is bounded ([`MAX_MODELS`], [`MAX_MODEL_NAME`]); a worker that
//! reports more is logged and the excess is not served.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};

use infermesh_proto::inference::ModelMetadataResponse;

/// Most models one node serves.
pub const MAX_MODELS: usize = 4096;
/// Longest model name accepted from a worker, in bytes.
pub const MAX_MODEL_NAME: usize = 256;

/// A model's index in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(pub u32);

impl ModelId {
    /// As an index into per-model vectors.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

#[derive(Debug)]
struct Entry {
    name: Arc<str>,
    metadata: Option<Arc<ModelMetadataResponse>>,
}

#[derive(Debug, Default)]
struct Table {
    ids: HashMap<Arc<str>, ModelId>,
    entries: Vec<Entry>,
}

/// Why a name could not be interned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InternError {
    /// The name is empty or longer than [`MAX_MODEL_NAME`].
    #[error("model name of {0} bytes is empty or longer than {MAX_MODEL_NAME}")]
    BadName(usize),
    /// The table holds [`MAX_MODELS`] already.
    #[error("this node already serves {MAX_MODELS} models")]
    Full,
}

/// The model table.
#[derive(Debug, Default)]
pub struct Models {
    table: RwLock<Table>,
}

impl Models {
    /// The id of `name`, if a worker has reported it.
    pub fn id(&self, name: &str) -> Option<ModelId> {
        self.read(|t| t.ids.get(name).copied())
    }

    /// The id and cached metadata of `name`.
    pub fn lookup(&self, name: &str) -> Option<(ModelId, Option<Arc<ModelMetadataResponse>>)> {
        self.read(|t| {
            let id = *t.ids.get(name)?;
            Some((id, t.entries[id.index()].metadata.clone()))
        })
    }

    /// The name of `id`.
    pub fn name(&self, id: ModelId) -> Arc<str> {
        self.read(|t| Arc::clone(&t.entries[id.index()].name))
    }

    /// Models' metadata as the workers describe them.
    pub fn metadata(&self, name: &str) -> Option<Arc<ModelMetadataResponse>> {
        self.lookup(name).and_then(|(_, m)| m)
    }

    /// Number of models known.
    pub fn len(&self) -> usize {
        self.read(|t| t.entries.len())
    }

    /// Whether no model is known yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The id of `name`, adding it if new.
    pub fn intern(&self, name: &str) -> Result<ModelId, InternError> {
        if let Some(id) = self.id(name) {
            return Ok(id);
        }
        if name.is_empty() || name.len() > MAX_MODEL_NAME {
            return Err(InternError::BadName(name.len()));
        }
        let mut t = self.table.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(id) = t.ids.get(name) {
            return Ok(*id);
        }
        if t.entries.len() >= MAX_MODELS {
            return Err(InternError::Full);
        }
        let id = ModelId(t.entries.len() as u32);
        let name: Arc<str> = Arc::from(name);
        t.ids.insert(Arc::clone(&name), id);
        t.entries.push(Entry {
            name,
            metadata: None,
        });
        Ok(id)
    }

    /// Keeps what a worker says about a model (interning it if new).
    pub fn set_metadata(&self, meta: ModelMetadataResponse) -> Result<ModelId, InternError> {
        let id = self.intern(&meta.name)?;
        let mut t = self.table.write().unwrap_or_else(PoisonError::into_inner);
        let entry = &mut t.entries[id.index()];
        if let Some(old) = &entry.metadata {
            if old.inputs != meta.inputs || old.outputs != meta.outputs {
                tracing::warn!(model = %meta.name, "workers describe this model differently; keeping the newest description");
            }
        }
        entry.metadata = Some(Arc::new(meta));
        Ok(id)
    }

    fn read<R>(&self, f: impl FnOnce(&Table) -> R) -> R {
        f(&self.table.read().unwrap_or_else(PoisonError::into_inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_is_stable_and_bounded() {
        let m = Models::default();
        let a = m.intern("dense").unwrap();
        assert_eq!(m.intern("dense").unwrap(), a);
        assert_eq!(m.id("dense"), Some(a));
        assert_eq!(m.id("other"), None);
        assert_eq!(&*m.name(a), "dense");
        assert_eq!(m.intern(""), Err(InternError::BadName(0)));
        let long = "x".repeat(MAX_MODEL_NAME + 1);
        assert!(m.intern(&long).is_err());
        for i in 1..MAX_MODELS {
            m.intern(&format!("m{i}")).unwrap();
        }
        assert_eq!(m.intern("one-too-many"), Err(InternError::Full));
    }

    #[test]
    fn metadata_is_kept_per_model() {
        let m = Models::default();
        let id = m
            .set_metadata(ModelMetadataResponse {
                name: "dense".into(),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(m.lookup("dense").unwrap().0, id);
        assert!(m.metadata("dense").is_some());
    }
}
