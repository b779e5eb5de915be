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
SKIPS = {
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.nodeid.split("/")[-1]
        reason = SKIPS.get(name) or SKIPS.get(name.split("[")[0])
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"kvpd adapter: {reason}"))
