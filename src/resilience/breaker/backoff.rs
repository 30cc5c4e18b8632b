//! [`Backoff`]: how long the breaker stays open after its n-th consecutive
//! trip: `min · 2ⁿ⁻¹`, capped at `max`, spread by a jitter fraction so that
//! replicas do not probe a recovering dependency in lock-step.

use std::time::Duration;

use rand::Rng;

/// A validated open-duration backoff.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    jitter: f64,
}

/// Why a [`Backoff`] was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidBackoff {
    /// `min` was zero.
    #[error("minimum must be greater than zero")]
    ZeroMin,
    /// `max` was below `min`.
    #[error("maximum must not be below the minimum")]
    MaxBelowMin,
    /// `jitter` was outside `0..=1`.
    #[error("jitter must be between 0 and 1")]
    Jitter,
}

impl Backoff {
    /// A backoff from `min` to `max` with `jitter` in `0..=1` (0 = none,
    /// 0.2 = ±20%).
    pub fn try_new(min: Duration, max: Duration, jitter: f64) -> Result<Self, InvalidBackoff> {
        if min.is_zero() {
            return Err(InvalidBackoff::ZeroMin);
        }
        if max < min {
            return Err(InvalidBackoff::MaxBelowMin);
        }
        if !(0.0..=1.0).contains(&jitter) {
            return Err(InvalidBackoff::Jitter);
        }
        Ok(Self { min, max, jitter })
    }

    /// The shortest open duration (first trip, before jitter).
    pub fn min(&self) -> Duration {
        self.min
    }

    /// The longest open duration.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The open duration after the `trip`-th consecutive trip (1-based).
    pub fn duration(&self, trip: u32) -> Duration {
        let doublings = trip.saturating_sub(1).min(31);
        let base = self
            .min
            .checked_mul(1u32 << doublings)
            .map_or(self.max, |d| d.min(self.max));
        if self.jitter == 0.0 {
            return base;
        }
        let spread = rand::rng().random_range(-self.jitter..=self.jitter);
        base.mul_f64(1.0 + spread).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_per_trip_and_stops_at_the_cap() {
        let b = Backoff::try_new(Duration::from_millis(500), Duration::from_secs(5), 0.0).unwrap();
        let got: Vec<_> = (1..=6).map(|t| b.duration(t).as_millis()).collect();
        assert_eq!(got, [500, 1000, 2000, 4000, 5000, 5000]);
        assert_eq!(b.duration(1000), Duration::from_secs(5));
    }

    #[test]
    fn jitter_stays_within_its_fraction_and_the_cap() {
        let b = Backoff::try_new(Duration::from_secs(1), Duration::from_secs(10), 0.2).unwrap();
        for _ in 0..200 {
            let d = b.duration(2);
            assert!(d >= Duration::from_millis(1600) && d <= Duration::from_millis(2400));
            assert!(b.duration(10) <= Duration::from_secs(10));
        }
    }

    #[test]
    fn bad_values_are_refused() {
        let s = Duration::from_secs(1);
        assert_eq!(
            Backoff::try_new(Duration::ZERO, s, 0.0),
            Err(InvalidBackoff::ZeroMin)
        );
        assert_eq!(
            Backoff::try_new(s * 2, s, 0.0),
            Err(InvalidBackoff::MaxBelowMin)
        );
        assert_eq!(Backoff::try_new(s, s, 1.5), Err(InvalidBackoff::Jitter));
        assert_eq!(
            Backoff::try_new(s, s, f64::NAN),
            Err(InvalidBackoff::Jitter)
        );
    }
}
