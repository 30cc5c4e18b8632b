"""404 through the SDK: a model the gateway does not serve raises
openai.NotFoundError with code model_not_found and param model."""

from levee_sdk import MESSAGES, client, openai

try:
    client().chat.completions.create(model="no-such-model", messages=MESSAGES)
except openai.NotFoundError as e:
    print(f"404 body: {e.body}")
    assert e.status_code == 404, f"status {e.status_code}"
    assert e.code == "model_not_found", f"error.code {e.code!r}"
    assert e.param == "model", f"error.param {e.param!r}"
else:
    raise AssertionError("a request for an unknown model was served")
print("ok")
