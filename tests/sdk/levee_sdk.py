"""Shared helpers of the OpenAI SDK scenarios (tests/openai_sdk.rs runs them).

Every scenario is a script that reads its URLs, keys and names from the
environment, drives the gateway with the official `openai` package, asserts
with plain `assert` and prints what it measured. The gateway's and the
simulator's own state (/metrics, /_stats, /_faults, the admin API) is read
and set over plain HTTP with the standard library, so only the SDK itself
talks to the OpenAI-compatible routes.
"""

import json
import os
import re
import time
import urllib.error
import urllib.request

import openai
from openai import OpenAI

# Upper bound of every poll in these scripts.
POLL_LIMIT_S = 4.5


def env(name):
    """The environment variable `name`, which the Rust harness must set."""
    value = os.environ.get(name)
    assert value, f"environment variable {name} is not set by the harness"
    return value


LEVEE_URL = env("LEVEE_URL")
MODEL = os.environ.get("LEVEE_MODEL", "gpt-4o-mini")

# A question and a system context the simulator answers from: it picks the
# context sentences sharing most words with the question.
CONTEXT = (
    "Full-time employees get 25 days of paid time off per calendar year. "
    "Unused paid time off can be rolled over up to 5 days. "
    "The office is closed on public holidays."
)
QUESTION = "How many days of paid time off do employees get?"
MESSAGES = [
    {"role": "system", "content": CONTEXT},
    {"role": "user", "content": QUESTION},
]


def client(key=None, max_retries=0, timeout=10.0):
    """An SDK client on the gateway's /v1, with the tenant key by default."""
    return OpenAI(
        base_url=f"{LEVEE_URL}/v1",
        api_key=key or env("LEVEE_KEY"),
        max_retries=max_retries,
        timeout=timeout,
    )


def http(method, url, body=None, headers=None, timeout=5.0):
    """(status, headers, body bytes) of one plain HTTP call."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("content-type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def get_json(url):
    status, _, body = http("GET", url)
    assert status == 200, f"GET {url}: {status} {body[:300]!r}"
    return json.loads(body)


def sim_llm(sim_url):
    """The simulator's `llm` stats (completions, token totals, streams_open)."""
    return get_json(f"{sim_url}/_stats")["llm"]


def sim_usage(sim_url):
    """(completions, prompt_tokens, completion_tokens, include_usage_requests)."""
    llm = sim_llm(sim_url)
    for key in ("completions", "prompt_tokens", "completion_tokens", "include_usage_requests"):
        assert key in llm, f"simulator /_stats has no llm.{key}: {llm}"
    return (
        llm["completions"],
        llm["prompt_tokens"],
        llm["completion_tokens"],
        llm["include_usage_requests"],
    )


def sim_faults(sim_url, spec):
    """Installs a fault set on the simulator (None clears every fault)."""
    if spec is None:
        status, _, body = http("DELETE", f"{sim_url}/_faults")
    else:
        status, _, body = http("POST", f"{sim_url}/_faults", spec)
    assert status == 200, f"simulator /_faults {spec}: {status} {body[:300]!r}"


def tenant_tokens(tenant):
    """`levee_ratelimit_tenant_tokens_total{tenant=...}` from GET /metrics."""
    status, _, body = http("GET", f"{LEVEE_URL}/metrics")
    assert status == 200, f"GET /metrics: {status}"
    pattern = re.compile(
        r'^levee_ratelimit_tenant_tokens_total\{[^}]*tenant="' + re.escape(tenant) + r'"[^}]*\}\s+(\S+)$'
    )
    for line in body.decode().splitlines():
        m = pattern.match(line)
        if m:
            return int(float(m.group(1)))
    raise AssertionError(f"/metrics has no levee_ratelimit_tenant_tokens_total for tenant {tenant!r}")


def wait_for(what, probe, want, limit_s=POLL_LIMIT_S):
    """Polls `probe()` until it returns `want` or `limit_s` passes; returns
    the last value and the seconds waited (the caller asserts)."""
    started = time.monotonic()
    value = probe()
    while value != want and time.monotonic() - started < limit_s:
        time.sleep(0.05)
        value = probe()
    waited = time.monotonic() - started
    print(f"{what}: {value!r} after {waited:.2f} s (want {want!r})")
    return value, waited


def settled_tokens(tenant, before, want):
    """Waits until the tenant's token counter moved by `want` since `before`,
    then checks it stays there (no second settlement); returns the delta."""
    delta, _ = wait_for(f"tenant {tenant} token delta", lambda: tenant_tokens(tenant) - before, want)
    if delta == want:
        time.sleep(0.3)
        delta = tenant_tokens(tenant) - before
    return delta


__all__ = [
    "openai",
    "client",
    "env",
    "http",
    "get_json",
    "sim_llm",
    "sim_usage",
    "sim_faults",
    "tenant_tokens",
    "wait_for",
    "settled_tokens",
    "LEVEE_URL",
    "MODEL",
    "MESSAGES",
    "QUESTION",
    "CONTEXT",
]
