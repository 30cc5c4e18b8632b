//! The router stage: keyword rules decide whether a question needs
//! retrieval or can be answered directly.

use super::config::{Route, RouterConfig};
use crate::text;

/// Compiled router rules.
#[derive(Debug, Clone)]
pub struct IntentRouter {
    default_route: Route,
    rules: Vec<(String, Vec<Vec<String>>, Route)>,
}

impl IntentRouter {
    /// Compiles the configured rules.
    pub fn new(config: &RouterConfig) -> Self {
        let rules = config
            .rules
            .iter()
            .map(|r| {
                let phrases = r.keywords.iter().map(|k| words(k)).collect();
                (r.name.clone(), phrases, r.route)
            })
            .collect();
        Self {
            default_route: config.default_route,
            rules,
        }
    }

    /// The route for `message`, and the name of the rule that chose it.
    pub fn route(&self, message: &str) -> (Route, &str) {
        let msg = words(message);
        for (name, phrases, route) in &self.rules {
            if phrases.iter().any(|p| contains_phrase(&msg, p)) {
                return (*route, name);
            }
        }
        (self.default_route, "default")
    }
}

fn words(s: &str) -> Vec<String> {
    s.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

fn contains_phrase(msg: &[String], phrase: &[String]) -> bool {
    !phrase.is_empty() && msg.windows(phrase.len()).any(|w| w == phrase)
}

/// The retrieval query for a message: a follow-up also carries the previous
/// question's content words, so "Can I roll more over?" still finds the
/// policy the thread is about.
pub fn retrieval_query(message: &str, previous_question: Option<&str>) -> String {
    match previous_question {
        Some(prev) => format!("{message} {}", text::tokens(prev).join(" ")),
        None => message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greetings_go_direct_and_questions_retrieve() {
        let r = IntentRouter::new(&RouterConfig::default());
        assert_eq!(r.route("Hello there!").0, Route::Direct);
        assert_eq!(r.route("thank you so much").0, Route::Direct);
        assert_eq!(r.route("What is the PTO policy?").0, Route::Retrieve);
        // whole words only: "this" does not contain "hi"
        assert_eq!(r.route("Is this covered?").0, Route::Retrieve);
    }
}
