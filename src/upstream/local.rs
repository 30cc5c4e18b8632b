//! The built-in vector store: an in-process lexical index (BM25 scoring)
//! over a small knowledge base of Acme Corp HR / IT policy documents.

use std::collections::HashMap;

use async_trait::async_trait;
use serde::Deserialize;

use super::{Passage, UpstreamError, VectorStore};
use crate::text;

/// The built-in knowledge base, shared with the upstream simulator.
const ACME_KB: &str = include_str!("../../data/acme_kb.json");
/// BM25 term-frequency saturation.
const K1: f32 = 1.2;
/// BM25 length normalisation.
const B: f32 = 0.75;

/// One knowledge-base document.
#[derive(Debug, Clone, Deserialize)]
pub struct Document {
    /// Stable id.
    pub id: String,
    /// Title.
    pub title: String,
    /// Where it lives.
    pub source: String,
    /// Full text.
    pub text: String,
}

/// In-process lexical index.
#[derive(Debug, Clone)]
pub struct LocalIndex {
    docs: Vec<(Document, HashMap<String, u32>, usize)>,
    doc_freq: HashMap<String, u32>,
    avg_len: f32,
}

impl LocalIndex {
    /// The index over the built-in Acme knowledge base.
    pub fn acme() -> Self {
        let docs: Vec<Document> =
            serde_json::from_str(ACME_KB).expect("data/acme_kb.json is valid and tested");
        Self::new(docs)
    }

    /// An index over `docs`.
    pub fn new(docs: Vec<Document>) -> Self {
        let mut doc_freq: HashMap<String, u32> = HashMap::new();
        let mut indexed = Vec::with_capacity(docs.len());
        let mut total_len = 0;
        for doc in docs {
            let words = text::tokens(&format!("{} {}", doc.title, doc.text));
            let mut tf: HashMap<String, u32> = HashMap::new();
            for w in &words {
                *tf.entry(w.clone()).or_default() += 1;
            }
            for w in tf.keys() {
                *doc_freq.entry(w.clone()).or_default() += 1;
            }
            total_len += words.len();
            indexed.push((doc, tf, words.len()));
        }
        let avg_len = total_len as f32 / indexed.len().max(1) as f32;
        Self {
            docs: indexed,
            doc_freq,
            avg_len,
        }
    }

    /// Scores every document against `query`; best first, zero scores dropped.
    pub fn rank(&self, query: &str, top_k: usize) -> Vec<Passage> {
        let mut terms = text::tokens(query);
        terms.sort();
        terms.dedup();
        let n = self.docs.len() as f32;
        let mut scored: Vec<(f32, &Document)> = self
            .docs
            .iter()
            .map(|(doc, tf, len)| {
                let score = terms
                    .iter()
                    .filter_map(|t| {
                        let f = *tf.get(t)? as f32;
                        let df = *self.doc_freq.get(t)? as f32;
                        let idf = ((n - df + 0.5) / (df + 0.5) + 1.0).ln();
                        let norm = K1 * (1.0 - B + B * *len as f32 / self.avg_len);
                        Some(idf * f * (K1 + 1.0) / (f + norm))
                    })
                    .sum::<f32>();
                (score, doc)
            })
            .filter(|(score, _)| *score > 0.0)
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
        scored
            .into_iter()
            .take(top_k)
            .map(|(score, doc)| Passage {
                id: doc.id.clone(),
                title: doc.title.clone(),
                source: doc.source.clone(),
                text: doc.text.clone(),
                score,
            })
            .collect()
    }
}

#[async_trait]
impl VectorStore for LocalIndex {
    fn kind(&self) -> &'static str {
        "builtin"
    }

    async fn search(
        &self,
        query: &str,
        top_k: usize,
        _tenant: &str,
    ) -> Result<Vec<Passage>, UpstreamError> {
        Ok(self.rank(query, top_k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pto_questions_rank_the_pto_policy_first() {
        let index = LocalIndex::acme();
        for q in [
            "What is the PTO policy?",
            "Can I rollover more than 5 days?",
        ] {
            let hits = index.rank(q, 3);
            assert_eq!(hits.first().map(|p| p.id.as_str()), Some("hr-pto"), "{q}");
        }
    }

    #[test]
    fn unrelated_question_finds_nothing() {
        assert!(LocalIndex::acme().rank("zebra giraffe", 3).is_empty());
    }
}
