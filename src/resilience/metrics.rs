//! [`ResilienceMetrics`]: the breaker, bulkhead and retry families,
//! registered into the one registry passed in. Each dependency gets its
//! own [`ResilienceObserver`] whose label handles are resolved once, when
//! the dependency is registered, so an event is one atomic increment.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::breaker::StateKind;
use super::{CallOutcome, ResilienceObserver};

/// Every breaker state, so the state gauge has one series per state.
const STATES: [StateKind; 5] = [
    StateKind::Closed,
    StateKind::Open,
    StateKind::HalfOpen,
    StateKind::ForcedOpen,
    StateKind::ForcedClosed,
];

/// Breaker outcomes exported (ignored calls are counted by the bulkhead).
const OUTCOMES: [CallOutcome; 4] = [
    CallOutcome::Success,
    CallOutcome::Failure,
    CallOutcome::Slow,
    CallOutcome::Rejected,
];

/// The transitions a breaker makes by itself (forced states are counted
/// when they happen).
const TRANSITIONS: [(StateKind, StateKind); 4] = [
    (StateKind::Closed, StateKind::Open),
    (StateKind::Open, StateKind::HalfOpen),
    (StateKind::HalfOpen, StateKind::Closed),
    (StateKind::HalfOpen, StateKind::Open),
];

/// The resilience families.
#[derive(Clone, Debug)]
pub struct ResilienceMetrics {
    breaker_state: IntGaugeVec,
    breaker_transitions: IntCounterVec,
    breaker_calls: IntCounterVec,
    bulkhead_rejections: IntCounterVec,
    retries: IntCounterVec,
    retry_budget_exhausted: IntCounterVec,
}

/// One dependency's handles; the observer its stack reports through.
#[derive(Debug)]
pub struct DependencyMetrics {
    family: ResilienceMetrics,
    dependency: String,
    states: [IntGauge; 5],
    outcomes: [IntCounter; 4],
    bulkhead_rejections: IntCounter,
    retries: IntCounter,
    retry_budget_exhausted: IntCounter,
}

impl ResilienceMetrics {
    /// Registers the families into `registry`.
    pub fn register(registry: &Registry) -> Self {
        use crate::telemetry::metrics::{counter, gauge};
        let r = registry;
        Self {
            breaker_state: gauge(
                r,
                "levee_breaker_state",
                "Circuit breaker state per dependency: 1 for the current state, 0 for the others.",
                &["dependency", "state"],
            ),
            breaker_transitions: counter(
                r,
                "levee_breaker_transitions_total",
                "Circuit breaker state transitions.",
                &["dependency", "from", "to"],
            ),
            breaker_calls: counter(
                r,
                "levee_breaker_calls_total",
                "Calls classified by a circuit breaker: success, failure, slow, rejected.",
                &["dependency", "outcome"],
            ),
            bulkhead_rejections: counter(
                r,
                "levee_bulkhead_rejections_total",
                "Calls a full bulkhead refused without calling the dependency.",
                &["dependency"],
            ),
            retries: counter(
                r,
                "levee_retries_total",
                "Retried attempts (the first attempt is not a retry).",
                &["dependency"],
            ),
            retry_budget_exhausted: counter(
                r,
                "levee_retry_budget_exhausted_total",
                "Retryable failures not retried because the retry budget was spent.",
                &["dependency"],
            ),
        }
    }

    /// The observer of `dependency`: its series exist at zero from now on,
    /// with the breaker `closed`, so rates work from the first event and
    /// dashboards show the dependency before anything happened to it.
    pub fn dependency(&self, dependency: &str) -> Arc<DependencyMetrics> {
        let d = dependency;
        for (from, to) in TRANSITIONS {
            self.breaker_transitions
                .with_label_values(&[d, from.as_str(), to.as_str()]);
        }
        let m = DependencyMetrics {
            states: STATES.map(|s| self.breaker_state.with_label_values(&[d, s.as_str()])),
            outcomes: OUTCOMES.map(|o| self.breaker_calls.with_label_values(&[d, o.as_str()])),
            bulkhead_rejections: self.bulkhead_rejections.with_label_values(&[d]),
            retries: self.retries.with_label_values(&[d]),
            retry_budget_exhausted: self.retry_budget_exhausted.with_label_values(&[d]),
            family: self.clone(),
            dependency: d.to_owned(),
        };
        m.set_state(StateKind::Closed);
        Arc::new(m)
    }
}

impl DependencyMetrics {
    fn set_state(&self, current: StateKind) {
        for (state, gauge) in STATES.iter().zip(&self.states) {
            gauge.set(i64::from(*state == current));
        }
    }
}

impl ResilienceObserver for DependencyMetrics {
    fn breaker_transition(&self, _: &'static str, from: StateKind, to: StateKind) {
        self.set_state(to);
        // Transitions are rare: the family lookup is fine here.
        self.family
            .breaker_transitions
            .with_label_values(&[&self.dependency, from.as_str(), to.as_str()])
            .inc();
    }

    fn breaker_outcome(&self, _: &'static str, outcome: CallOutcome) {
        if let Some(i) = OUTCOMES.iter().position(|o| *o == outcome) {
            self.outcomes[i].inc();
        }
    }

    fn retry(&self, _: &'static str, _attempt: u32, _delay: Duration) {
        self.retries.inc();
    }

    fn retry_budget_exhausted(&self, _: &'static str) {
        self.retry_budget_exhausted.inc();
    }

    fn bulkhead_rejected(&self, _: &'static str) {
        self.bulkhead_rejections.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::telemetry::metrics::tests::value;

    fn encode(r: &Registry) -> String {
        use prometheus::Encoder;
        let mut buf = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&r.gather(), &mut buf)
            .unwrap();
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn breaker_state_gauge_has_exactly_one_current_state() {
        let r = Registry::new();
        let m = ResilienceMetrics::register(&r);
        let llm = m.dependency("llm");
        let text = encode(&r);
        assert_eq!(
            value(
                &text,
                r#"levee_breaker_state{dependency="llm",state="closed"}"#
            ),
            Some(1.0)
        );
        llm.breaker_transition("llm", StateKind::Closed, StateKind::Open);
        let text = encode(&r);
        assert_eq!(
            value(
                &text,
                r#"levee_breaker_state{dependency="llm",state="closed"}"#
            ),
            Some(0.0)
        );
        assert_eq!(
            value(
                &text,
                r#"levee_breaker_state{dependency="llm",state="open"}"#
            ),
            Some(1.0)
        );
        let ones = text
            .lines()
            .filter(|l| {
                l.starts_with(r#"levee_breaker_state{dependency="llm""#) && l.ends_with(" 1")
            })
            .count();
        assert_eq!(ones, 1);
        assert_eq!(
            value(
                &text,
                r#"levee_breaker_transitions_total{dependency="llm",from="closed",to="open"}"#
            ),
            Some(1.0)
        );
    }

    #[test]
    fn observer_events_are_counted_and_ignored_calls_are_not() {
        let r = Registry::new();
        let m = ResilienceMetrics::register(&r);
        let o: Arc<dyn ResilienceObserver> = m.dependency("vector_store");
        o.breaker_outcome("vector_store", CallOutcome::Failure);
        o.breaker_outcome("vector_store", CallOutcome::Ignored);
        o.retry("vector_store", 2, Duration::from_millis(10));
        o.retry_budget_exhausted("vector_store");
        o.bulkhead_rejected("vector_store");
        let text = encode(&r);
        let dep = r#"dependency="vector_store""#;
        assert_eq!(
            value(
                &text,
                &format!("levee_breaker_calls_total{{{dep},outcome=\"failure\"}}")
            ),
            Some(1.0)
        );
        assert!(!text.contains("outcome=\"ignored\""));
        assert_eq!(
            value(&text, &format!("levee_retries_total{{{dep}}}")),
            Some(1.0)
        );
        assert_eq!(
            value(
                &text,
                &format!("levee_retry_budget_exhausted_total{{{dep}}}")
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&text, &format!("levee_bulkhead_rejections_total{{{dep}}}")),
            Some(1.0)
        );
    }
}
