"""503 through the SDK: with every deployment's breaker forced open the
call raises openai.APIStatusError 503 with Retry-After, without reaching
the simulator; once the breakers are reset the model answers again."""

from levee_sdk import LEVEE_URL, MESSAGES, MODEL, client, env, http, openai, sim_usage

SIM = env("SIM_URL")
TOKEN = env("ADMIN_TOKEN")
BREAKERS = env("BREAKERS").split(",")
AUTH = {"authorization": f"Bearer {TOKEN}"}


def admin(name, action):
    status, _, body = http("POST", f"{LEVEE_URL}/admin/breakers/{name}/{action}", headers=AUTH)
    assert status == 200, f"admin {action} of {name}: {status} {body[:300]!r}"


c = client(max_retries=0)
try:
    for name in BREAKERS:
        admin(name, "force_open")
    before = sim_usage(SIM)[0]
    try:
        c.chat.completions.create(model=MODEL, messages=MESSAGES)
    except openai.APIStatusError as e:
        err = e
    else:
        raise AssertionError("served with every breaker open")
    print(f"503 headers: retry-after={err.response.headers.get('retry-after')!r}; body {err.body}")
    assert err.status_code == 503, f"status {err.status_code}: {err.body}"
    assert err.response.headers.get("retry-after"), "no retry-after on the 503"
    assert int(err.response.headers["retry-after"]) >= 1, "retry-after below 1 s"
    assert sim_usage(SIM)[0] == before, "a call reached the simulator through open breakers"
finally:
    for name in BREAKERS:
        admin(name, "reset")

resp = c.chat.completions.create(model=MODEL, messages=MESSAGES)
assert resp.choices[0].message.content, "no answer after the breakers were reset"
print("ok")
