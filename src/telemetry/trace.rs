//! Logs and traces: one `tracing` subscriber with two layers.
//!
//! - **Logs** go to stderr, filtered by `LEVEE_LOG` (default `info`).
//! - **Spans** go to OpenTelemetry (tracing-opentelemetry). With an OTLP
//!   endpoint configured (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//!   `OTEL_EXPORTER_OTLP_ENDPOINT`) they are batched (`OTEL_BSP_*`) and
//!   exported over gRPC or HTTP/protobuf (`OTEL_EXPORTER_OTLP_PROTOCOL`,
//!   default `grpc`), sampled per `OTEL_TRACES_SAMPLER` /
//!   `OTEL_TRACES_SAMPLER_ARG`, as service `OTEL_SERVICE_NAME` (default
//!   `levee`). Without an endpoint there is no exporter and no background
//!   thread; spans still carry W3C trace context, so a client's
//!   `traceparent` still reaches the upstreams.
//!
//! [`Tracing::shutdown`] flushes what is batched; call it after the server
//! has drained, while the Tokio runtime is still alive (the exporters'
//! connections live on it).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Level;
use tracing_subscriber::filter::{self, EnvFilter, FilterExt, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer as _;

use super::otlp_http::OtlpHttpClient;

/// Default `OTEL_SERVICE_NAME`.
pub const DEFAULT_SERVICE_NAME: &str = "levee";

/// Default log filter when `LEVEE_LOG` is unset or invalid.
pub const DEFAULT_LOG_FILTER: &str = "info";

/// How traces leave the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP over gRPC (`grpc`, usually port 4317).
    Grpc,
    /// OTLP over HTTP with protobuf bodies (`http/protobuf`, usually 4318).
    HttpProtobuf,
}

/// Where spans go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exporter {
    /// No endpoint configured: nothing is exported.
    Disabled,
    /// OTLP export; the endpoint itself is read by the exporter from the
    /// standard variables.
    Otlp {
        /// The transport.
        protocol: OtlpProtocol,
        /// The endpoint, for the startup log line.
        endpoint: String,
    },
}

/// Logging and tracing settings, read from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TracingConfig {
    /// `LEVEE_LOG`: the stderr log filter.
    pub log_filter: String,
    /// `OTEL_SERVICE_NAME`.
    pub service_name: String,
    /// The span exporter.
    pub exporter: Exporter,
}

/// A bad `OTEL_*` value, named with its variable.
#[derive(Debug, thiserror::Error)]
pub enum TracingError {
    /// A variable has a value Levee does not support.
    #[error("invalid {var} = {value:?}: {reason}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// Why.
        reason: &'static str,
    },
    /// The exporter could not be built.
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
    /// A global subscriber was already installed.
    #[error("cannot install the tracing subscriber: {0}")]
    Subscriber(String),
}

/// The installed pipeline; keep it until shutdown.
#[derive(Debug)]
pub struct Tracing {
    provider: SdkTracerProvider,
    exporting: bool,
}

impl TracingConfig {
    /// Reads `LEVEE_LOG` and the `OTEL_*` variables through `vars`.
    pub fn from_env(vars: impl Fn(&str) -> Option<String>) -> Result<Self, TracingError> {
        let var = |k: &str| {
            vars(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let log_filter = var("LEVEE_LOG").unwrap_or_else(|| DEFAULT_LOG_FILTER.to_owned());
        let service_name =
            var("OTEL_SERVICE_NAME").unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());
        let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
        let endpoint = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"));
        let exporter = match endpoint {
            Some(endpoint) if !disabled => {
                let (name, value) = match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
                    Some(v) => ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", Some(v)),
                    None => (
                        "OTEL_EXPORTER_OTLP_PROTOCOL",
                        var("OTEL_EXPORTER_OTLP_PROTOCOL"),
                    ),
                };
                let protocol = match value.as_deref() {
                    None | Some("grpc") => OtlpProtocol::Grpc,
                    Some("http/protobuf") => OtlpProtocol::HttpProtobuf,
                    Some(other) => {
                        return Err(TracingError::Invalid {
                            var: name,
                            value: other.to_owned(),
                            reason: "must be `grpc` or `http/protobuf`",
                        })
                    }
                };
                Exporter::Otlp { protocol, endpoint }
            }
            _ => Exporter::Disabled,
        };
        Ok(Self {
            log_filter,
            service_name,
            exporter,
        })
    }
}

fn build_provider(config: &TracingConfig) -> Result<SdkTracerProvider, TracingError> {
    let resource = Resource::builder()
        .with_service_name(config.service_name.clone())
        .build();
    // The sampler comes from OTEL_TRACES_SAMPLER(_ARG); the SDK reads them.
    let builder = SdkTracerProvider::builder().with_resource(resource);
    let exporter = match &config.exporter {
        Exporter::Disabled => return Ok(builder.build()),
        Exporter::Otlp {
            protocol: OtlpProtocol::Grpc,
            ..
        } => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_protocol(Protocol::Grpc)
            .build(),
        Exporter::Otlp {
            protocol: OtlpProtocol::HttpProtobuf,
            ..
        } => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_http_client(
                OtlpHttpClient::new().map_err(|e| TracingError::Exporter(e.to_string()))?,
            )
            .build(),
    }
    .map_err(|e| TracingError::Exporter(e.to_string()))?;
    // The batch processor exports from its own thread, OTEL_BSP_* tuned.
    Ok(builder.with_batch_exporter(exporter).build())
}

impl Tracing {
    /// Installs the global subscriber. Must run inside a Tokio runtime
    /// context (the exporters keep their connections on it).
    pub fn init(config: &TracingConfig) -> Result<Self, TracingError> {
        let provider = build_provider(config)?;
        let exporting = config.exporter != Exporter::Disabled;
        let log_filter = EnvFilter::try_new(&config.log_filter)
            .unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
        // With no exporter, nothing consumes spans but the log layer's
        // context prefix; letting it see them would build every request's
        // spans (a slab entry, formatted fields, several allocations) for
        // nothing. The log layer then takes events only, so no layer is
        // interested in a span and `info_span!` costs a cached interest
        // check.
        let events_only = filter::filter_fn(move |meta| exporting || meta.is_event());
        let logs = tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(log_filter.and(events_only));
        // Spans are Levee's own (target `levee::…`), whatever `LEVEE_LOG`
        // says, and never the HTTP/2 or Redis client internals (which
        // would also trace the exporter's own calls).
        let registry = tracing_subscriber::registry().with(logs);
        // Two arms rather than an `Option` layer: an absent layer reports
        // interest in everything, which would enable every span again.
        let installed = if exporting {
            let spans = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("levee"))
                .with_threads(false)
                .with_filter(Targets::new().with_target("levee", Level::INFO));
            registry.with(spans).try_init()
        } else {
            registry.try_init()
        };
        installed.map_err(|e| TracingError::Subscriber(e.to_string()))?;
        if let Exporter::Otlp { protocol, endpoint } = &config.exporter {
            tracing::info!(?protocol, %endpoint, service = %config.service_name, "exporting traces over OTLP");
        }
        Ok(Self {
            provider,
            exporting,
        })
    }

    /// Installs only the stderr log layer (for commands that do not serve).
    pub fn init_logs(log_filter: &str) {
        let filter =
            EnvFilter::try_new(log_filter).unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .try_init();
    }

    /// Whether spans are exported.
    pub fn is_exporting(&self) -> bool {
        self.exporting
    }

    /// Exports every span still batched and stops the exporter. Blocks
    /// until the export finishes or times out; call it from a thread that
    /// is not a runtime worker (e.g. `spawn_blocking`, or after `block_on`
    /// returned).
    pub fn shutdown(self) {
        if !self.exporting {
            return;
        }
        if let Err(e) = self.provider.shutdown() {
            eprintln!("levee: flushing traces failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<TracingConfig, TracingError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        TracingConfig::from_env(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn no_endpoint_means_no_exporter() {
        let c = config(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap();
        assert_eq!(c.exporter, Exporter::Disabled);
        assert_eq!(c.service_name, "levee");
        assert_eq!(c.log_filter, "info");
    }

    #[test]
    fn protocol_defaults_to_grpc_and_signal_variables_win() {
        let c = config(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")]).unwrap();
        assert_eq!(
            c.exporter,
            Exporter::Otlp {
                protocol: OtlpProtocol::Grpc,
                endpoint: "http://127.0.0.1:4317".into()
            }
        );
        let c = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "http://b:4318/v1/traces",
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "edge"),
        ])
        .unwrap();
        assert_eq!(
            c.exporter,
            Exporter::Otlp {
                protocol: OtlpProtocol::HttpProtobuf,
                endpoint: "http://b:4318/v1/traces".into()
            }
        );
        assert_eq!(c.service_name, "edge");
    }

    #[test]
    fn unsupported_protocol_is_named() {
        let err = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ])
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid OTEL_EXPORTER_OTLP_PROTOCOL = \"http/json\": must be `grpc` or `http/protobuf`"
        );
    }

    #[test]
    fn sdk_disabled_turns_export_off() {
        let c = config(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
            ("OTEL_SDK_DISABLED", "true"),
        ])
        .unwrap();
        assert_eq!(c.exporter, Exporter::Disabled);
    }
}
