"""kvpd in place of llama-server for llama.cpp's server tests (tools/server/tests/unit).

llama.cpp's test files do `from utils import *`. This module is found first (run.sh puts
its folder first on the path): it loads llama.cpp's own utils.py from LLAMACPP_TESTS,
takes everything it defines, and replaces ServerProcess.start and stop so that every
server a test starts is a kvpd (KVPD_BIN) on the same host and port, with the options
kvpd has an equivalent for. A test that asks for one it has none for (embeddings, LoRA,
a draft model, a model not in KVP_SHARED/models, ...) is skipped, naming it, so what
fails is what kvpd answers differently. Nothing of llama.cpp's is kept in this tree.
"""
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import types

import pytest

_TESTS = os.environ.get("LLAMACPP_TESTS", "")
_spec = importlib.util.spec_from_file_location("llamacpp_utils", os.path.join(_TESTS, "utils.py"))
if "wget" not in sys.modules:
    try:
        import wget  # noqa: F401  (only its downloads use it)
    except ImportError:
        sys.modules["wget"] = types.ModuleType("wget")
if "openai" not in sys.modules:
    try:
        import openai  # noqa: F401
    except ImportError:
        # the tests import it at the top; without it only those that use it are skipped
        _openai = types.ModuleType("openai")

        class _NoOpenAI:
            def __init__(self, *args, **kwargs):
                pytest.skip("kvpd adapter: the openai Python package is not installed")

        _openai.OpenAI = _NoOpenAI
        sys.modules["openai"] = _openai
_real = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_real)
globals().update({k: v for k, v in vars(_real).items() if not k.startswith("__")})
if not hasattr(_real, "LLAMA_CPP_ROOT"):
    # newer test files name the checkout's root (its models/templates) by this
    _real.LLAMA_CPP_ROOT = os.path.normpath(os.path.join(_TESTS, "..", "..", ".."))
LLAMA_CPP_ROOT = _real.LLAMA_CPP_ROOT
# what `from utils import *` gives the test files: llama.cpp's names and the ones
# replaced here, not this module's pytest hook (run.sh loads it once as a plugin)
__all__ = [k for k in vars(_real) if not k.startswith("_")] + ["LLAMA_CPP_ROOT"]

KVPD_BIN = os.environ.get("KVPD_BIN", "")
MODELS = os.path.join(os.environ.get("KVP_SHARED", ""), "models")

# llama.cpp's test models by their Hugging Face name, as the files KVP_SHARED holds
_MODELS = {
    "ggml-org/test-model-stories260K": "stories260K.gguf",
    "ggml-org/models/tinyllamas/stories260K.gguf": "stories260K.gguf",
}

# ServerProcess options without a kvpd equivalent: a test setting one is skipped
_NONE = ["model_draft", "server_embeddings", "server_reranking", "lora_files", "mmproj_url",
         "slot_save_path", "n_ga", "spec_type", "models_dir", "models_preset", "pooling",
         "server_tools", "mcp_servers_config", "mcp_servers_json", "sleep_idle_seconds",
         "gcp_compat", "enable_ctx_shift", "reasoning_format", "reasoning", "model_tags",
         "no_webui", "no_ui", "media_path", "prefill_nodes", "backend_sampling"]

# the chat template families kvpd renders by name (--chat-template)
_TEMPLATES = ["chatml", "llama3", "llama2", "mistral", "zephyr", "phi3", "gemma"]


def _model(self):
    if getattr(self, "model_file", None):
        path = self.model_file
        if os.path.exists(path):
            return path
        name = os.path.basename(path)
    else:
        repo = getattr(self, "model_hf_repo", None) or ""
        hf_file = getattr(self, "model_hf_file", None)
        name = _MODELS.get(f"{repo}/{hf_file}" if hf_file else repo)
        if not name:
            pytest.skip(f"kvpd adapter: no local copy of the model {repo} {hf_file or ''}")
    path = os.path.join(MODELS, name)
    if not os.path.exists(path):
        pytest.skip(f"kvpd adapter: {path} is missing")
    return path


def _start(self, timeout_seconds=60):
    if not KVPD_BIN:
        pytest.skip("kvpd adapter: KVPD_BIN is not set")
    for opt in _NONE:
        if getattr(self, opt, None):
            pytest.skip(f"kvpd adapter: kvpd has no equivalent of llama-server's {opt}")
    args = [KVPD_BIN, "--listen", f"{self.server_host}:{self.server_port}",
            "--model", _model(self), "--state-dir", "",
            "--temperature", str(self.temperature), "--seed", str(self.seed),
            "--fixed-seed", "true"]   # llama-server samples every request with --seed
    if self.api_key:
        args += ["--api-key", self.api_key]
    if self.n_predict and self.n_predict > 0:   # -1: no limit, kvpd's 0
        args += ["--max-tokens", str(self.n_predict)]
    if getattr(self, "cors_origins", None):
        args += ["--allowed-origins", self.cors_origins]
    if self.model_alias:
        args += ["--model-alias", self.model_alias]
    if getattr(self, "chat_template", None):
        if self.chat_template not in _TEMPLATES:
            pytest.skip(f"kvpd adapter: kvpd has no chat template named {self.chat_template!r}")
        args += ["--chat-template", self.chat_template]
    if getattr(self, "chat_template_file", None):
        if not os.path.exists(self.chat_template_file):
            pytest.skip(f"kvpd adapter: {self.chat_template_file} is missing")
        args += ["--chat-template-file", self.chat_template_file]
    self._kvpd_log = tempfile.NamedTemporaryFile(prefix="kvpd-", suffix=".log", delete=False)
    print(f"tests: starting kvpd with: {' '.join(args)} (log {self._kvpd_log.name})")
    self.process = subprocess.Popen(args, stdout=self._kvpd_log, stderr=subprocess.STDOUT)
    _real.server_instances.add(self)
    deadline = time.time() + timeout_seconds
    while time.time() < deadline:
        try:
            if self.make_request("GET", "/health").status_code == 200:
                self.ready = True
                return
        except Exception:
            pass
        if self.process.poll() is not None:
            raise RuntimeError(f"kvpd exited with {self.process.returncode}: see {self._kvpd_log.name}")
        time.sleep(0.05)
    raise TimeoutError(f"kvpd did not start within {timeout_seconds} s")


def _stop(self):
    _real.server_instances.discard(self)
    if self.process:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        self.process = None
    log = getattr(self, "_kvpd_log", None)
    if log:
        log.close()


_real.ServerProcess.start = _start
_real.ServerProcess.stop = _stop
if hasattr(_real, "ServerPreset"):
    # it starts every preset once to download its model: kvpd's are local files
    _real.ServerPreset.load_all = staticmethod(lambda: None)
ServerProcess = _real.ServerProcess

# Tests kvpd does not pass by design, by pytest id ("file.py::name", or with
# "[parameters]" for one case), with why; each is reported as skipped with its reason.
_TEXT = ("the exact text stories260K writes under llama.cpp's sampler (kvpd's sampler draws "
         "differently from the same seed)")
_CTX = ("llama-server's per-slot context (n_ctx / n_slots) and its overflow errors: kvpd gives "
        "each conversation the model's whole context and evicts KV rows past its budget")
SKIPS = {
    "test_basic.py::test_server_props": "/props n_ctx is n_ctx / n_slots; " + _CTX,
    "test_basic.py::test_server_slots": "kvpd always serves /slots (the caller's own "
        "conversations held in memory, not a fixed set of slots; no --no-slots)",
    "test_chat_completion.py::test_chat_completion": "llama.cpp's build fingerprint "
        "(system_fingerprint \"b...\"), its chatml fallback's prompt token counts for a model "
        "without a template, and " + _TEXT,
    "test_chat_completion.py::test_chat_completion_cached_tokens": "the prompt token counts "
        "of llama.cpp's chatml fallback (kvpd renders a model without a template plainly)",
    "test_chat_completion.py::test_chat_completion_stream": "the role chunk's delta.content: "
        "kvpd sends \"\" (as OpenAI's API does), llama.cpp null; and " + _TEXT,
    "test_chat_completion.py::test_chat_completion_with_timings_per_token": "timings_per_token "
        "(kvpd refuses it naming the field: it reports no timings in a chat stream)",
    "test_chat_completion.py::test_chat_template": "the __verbose echo of the prompt (llama-server "
        "--verbose): kvpd has none",
    "test_chat_completion.py::test_completion_with_response_format[response_format1-10-[ -3000 ]]":
        "items as an array (a tuple): kvpd's schemas refuse it naming the schema",
    "test_chat_completion.py::test_completion_with_response_format[response_format2-10-\"foooooo\"]":
        "a json_schema without a name: kvpd requires json_schema.name as OpenAI's API does",
    "test_chat_completion.py::test_completion_with_grammar": "GBNF grammars: kvpd refuses "
        "grammar naming it (JSON schemas constrain replies)",
    "test_chat_completion.py::test_context_size_exceeded": _CTX,
    "test_chat_completion.py::test_context_size_exceeded_stream": _CTX,
    "test_chat_completion.py::test_return_progress": "return_progress (kvpd refuses it naming "
        "the field: it reports no prompt progress)",
    "test_chat_completion.py::test_chat_completions_multiple_choices": "id_slot 0 pins a "
        "llama-server slot: kvpd refuses id_slot other than -1 naming it",
    "test_completion.py::test_completion[I believe the meaning of life is-8-(going|bed)+-18-8-False-False]": _TEXT,
    "test_completion.py::test_completion_stream[I believe the meaning of life is-8-(going|bed)+-18-8-False]": _TEXT,
    "test_completion.py::test_nocache_long_input_prompt": _CTX,
    "test_completion.py::test_completion_with_tokens_input": "several prompts in one request "
        "(answered by an array): kvpd runs one prompt a request and refuses more naming prompt",
    "test_completion.py::test_completion_unified": "kv_unified: llama-server's one 256-token KV "
        "cache shared by 4 slots running out; " + _CTX,
    "test_completion.py::test_completion_response_fields[I believe the meaning of life is-32-response_fields1]":
        "prompt echoed as llama.cpp detokenizes it, BOS spelled \"<s> \": kvpd echoes the prompt "
        "as sent",
    "test_completion.py::test_n_probs_post_sampling": "post_sampling_probs: kvpd's logprobs are "
        "the model's distribution and it refuses the field naming it",
    "test_ctx_shift.py::test_ctx_shift_disabled_short_prompt[-1-248-True]": _CTX,
    "test_ctx_shift.py::test_ctx_shift_disabled_long_prompt": _CTX,
    "test_compat_oai_responses.py::test_responses_stream_with_llama_telemetry": "return_progress "
        "and timings_per_token (kvpd refuses them naming the field: it reports neither)",
    "test_metrics.py::test_prompt_cache_metrics": "llama.cpp's metric names (llamacpp:*); kvpd's "
        "are kvpd_*",
    "test_security.py::test_access_public_endpoint[/models]": "kvpd requires the API key on "
        "/models, as on every model endpoint",
    "test_security.py::test_access_static_assets_without_api_key": "llama.cpp's web UI files "
        "(bundle.js, bundle.css): kvpd's chat page has others",
    "test_security.py::test_correct_api_key": "/completions: kvpd serves it as OpenAI's "
        "/v1/completions (for SDKs given a base URL without /v1), llama.cpp as /completion",
    "test_security.py::test_correct_api_key_anthropic_header": "/completions as above, and the "
        "X-Api-Key header: kvpd takes the key from Authorization: Bearer only",
    "test_security.py::test_cors_options": "Origins that are not scheme://host[:port], and "
        "Access-Control-Allow-Credentials: kvpd answers only allowed_origins and never allows "
        "credentials",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        path, _, test = item.nodeid.partition("::")
        name = os.path.basename(path) + "::" + test
        reason = SKIPS.get(name) or SKIPS.get(name.split("[")[0])
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"kvpd adapter: {reason}"))
