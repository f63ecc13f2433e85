"""An in-process fake of the Hugging Face Hub HTTP API, for tests that push to the Hub.

`record_hub_requests()` lets `huggingface_hub.HfApi` run its real code (`create_repo`, `create_branch`,
`upload_folder`, `upload_file`, `create_commit`, ...) and replaces only the HTTP client underneath it:

* Hook: every sync call of huggingface_hub 2.4 goes through the shared client of `huggingface_hub.utils._http.get_session`,
  built by the factory installed with the public `huggingface_hub.set_client_factory` (`set_async_client_factory` for
  async calls). The factory installed here returns an `httpx2.Client` on an `httpx2.MockTransport`, so no socket is ever
  opened, whatever the host (`HF_ENDPOINT`) or proxy settings; it leaves out `hf_request_event_hook`, which is the only
  thing that raises under `HF_HUB_OFFLINE=1`, so offline mode does not block the fake uploads. On exit the previous
  factories (read from `_http._GLOBAL_CLIENT_FACTORY`, there is no public getter) are put back; `set_client_factory`
  also calls `close_session`, dropping the cached fake client.
* Xet: with `hf_xet` installed, `HfApi.upload_folder` goes to `_upload_pipeline.pipelined_upload` and
  `_commit_api._upload_files` to `_upload_xet_files`; both hand LFS files to `hf_xet`, whose Rust client does its own
  HTTP. No answer of the Hub can avoid that (the client picks Xet from `utils._runtime.is_xet_available()` alone), so
  the recorder sets `huggingface_hub.constants.HF_HUB_DISABLE_XET = True` (what the `HF_HUB_DISABLE_XET` variable sets
  at import) while it is active: uploads take the plain LFS path (`_commit_api._upload_files` ->
  `lfs.post_lfs_batch_info` -> `lfs.lfs_upload`), the same whether the variable is set or not.
* Token: `HF_TOKEN` is set to a fake token and `HF_OIDC_RESOURCE` is removed, then both are restored.

What the fake Hub answers (anything else gets HTTP 501, so an unexpected call fails loudly; the one such call
huggingface_hub makes on its own, `GET /api/agent-harnesses` from `utils/_detect_agent.py`, shrugs it off):

* `POST /api/repos/create` (`HfApi.create_repo`): `{"url": ...}`, or 409 if the repo was already created here.
* `POST /api/{type}s/{repo}/branch/{branch}` (`HfApi.create_branch`): 200, or 409 if created before.
* `POST /api/validate-yaml` (`HfApi._validate_yaml`, on README.md commits): no errors, no warnings.
* `POST /api/{type}s/{repo}/preupload/{rev}` (`_commit_api._fetch_upload_modes`): `uploadMode` "lfs" for binary
  content (a NUL byte in the sample), files of 10 MB or more and the usual `.gitattributes` LFS suffixes
  (`.safetensors`, `.bin`, ...), else "regular"; never ignored, no remote `oid` (every file is new).
* `POST /{repo}.git/info/lfs/objects/batch` (`lfs.post_lfs_batch_info`): a basic-transfer "upload" action to a fake
  storage URL, or no action (already present) for an oid uploaded before. The `PUT` to that URL
  (`lfs._upload_single_part`) is checked against the sha256 oid and its size recorded in `lfs_uploads`.
* `POST /api/{type}s/{repo}/commit/{rev}` (`_commit_api._send_commit`): the ndjson payload is parsed and recorded,
  and answered with `commitOid` = sha1 of the payload, a deterministic 40-hex id.
"""

import base64
import contextlib
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import httpx2
from huggingface_hub import constants, set_async_client_factory, set_client_factory
from huggingface_hub.utils import _http


FAKE_TOKEN = "hf_fakeRecorderToken0123456789abcdef"
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".onnx", ".msgpack", ".model", ".pkl", ".npy")
LFS_SUFFIXES += (".npz", ".zip", ".gz", ".tar", ".parquet", ".arrow", ".tflite", ".pb", ".joblib", ".zst", ".xz")
_REPO_OP = re.compile(
    r"^/api/(?P<type>model|dataset|space)s/(?P<repo>[^?]+)/(?P<op>preupload|commit|branch)/(?P<rev>[^/]+)$"
)
_LFS_BATCH = re.compile(r"\.git/info/lfs/objects/batch$")
_LFS_STORAGE = "/fake-lfs-storage/"


@dataclass
class HubRecorder:
    """What the fake Hub received. Lists are in request order; `files` maps path in repo -> size in bytes.

    - `requests`: `[(method, url), ...]`, every request, answered or not.
    - `created_repos`: `[{"repo_id", "repo_type", "private"}, ...]`
    - `created_branches`: `[{"repo_id", "repo_type", "branch", "starting_point"}, ...]` (`starting_point` may be None)
    - `commits`: `[{"repo_id", "repo_type", "revision", "message", "description", "parent_commit", "files",
      "contents", "lfs_files", "deleted", "oid"}, ...]`; `files` holds regular (inline base64) and LFS files alike,
      `contents` the bytes of the regular ones, `lfs_files`
      is the sorted list of those sent as LFS pointers, `deleted` the deleted file/folder paths, `oid` the answered
      40-hex commit id (`CommitInfo.oid`).
    - `lfs_uploads`: `{sha256 oid: size}` of the LFS contents PUT to the fake storage.
    """

    requests: list[tuple[str, str]] = field(default_factory=list)
    created_repos: list[dict[str, Any]] = field(default_factory=list)
    created_branches: list[dict[str, Any]] = field(default_factory=list)
    commits: list[dict[str, Any]] = field(default_factory=list)
    lfs_uploads: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        """The `httpx2.MockTransport` handler: one fake Hub answer per request (threads share it, hence the lock)."""
        with self._lock:
            self.requests.append((request.method, str(request.url)))
            return self._answer(request)

    def _answer(self, request: httpx2.Request) -> httpx2.Response:
        origin = f"{request.url.scheme}://{request.url.netloc.decode()}"
        path = request.url.raw_path.decode().partition("?")[0]  # revisions stay quoted: "refs%2Fpr%2F1"
        if request.method == "PUT" and path.startswith(_LFS_STORAGE):
            oid = path.removeprefix(_LFS_STORAGE)
            if hashlib.sha256(request.content).hexdigest() != oid:
                return _error(400, "fake Hub: uploaded content does not match its sha256 oid")
            self.lfs_uploads[oid] = len(request.content)
            return httpx2.Response(200)
        if request.method != "POST":
            return _error(501, f"fake Hub: no handler for {request.method} {path}")
        if path == "/api/validate-yaml":
            return httpx2.Response(200, json={"errors": [], "warnings": []})
        if path == "/api/repos/create":
            return self._create_repo(json.loads(request.content), origin)
        if _LFS_BATCH.search(path):
            return self._lfs_batch(json.loads(request.content), origin)
        match = _REPO_OP.match(path)
        if match is None:
            return _error(501, f"fake Hub: no handler for POST {path}")
        repo = {"repo_id": match["repo"], "repo_type": match["type"]}
        revision = unquote(match["rev"])
        if match["op"] == "branch":
            return self._create_branch(repo, revision, json.loads(request.content or b"{}"))
        if match["op"] == "preupload":
            return httpx2.Response(200, json={"files": [_upload_mode(f) for f in json.loads(request.content)["files"]]})
        return self._commit(repo, revision, request, origin)

    def _create_repo(self, payload: dict, origin: str) -> httpx2.Response:
        repo_type = payload.get("type") or "model"
        repo_id = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
        url = f"{origin}/{constants.REPO_TYPES_URL_PREFIXES.get(repo_type, '')}{repo_id}"
        if any(r["repo_id"] == repo_id and r["repo_type"] == repo_type for r in self.created_repos):
            return _error(409, f"You already created this {repo_type} repo", url=url)
        self.created_repos.append(
            {"repo_id": repo_id, "repo_type": repo_type, "private": payload.get("visibility") == "private"}
        )
        return httpx2.Response(200, json={"url": url, "name": repo_id})

    def _create_branch(self, repo: dict, branch: str, payload: dict) -> httpx2.Response:
        if any(b["branch"] == branch and repo.items() <= b.items() for b in self.created_branches):
            return _error(409, "Reference already exists")
        self.created_branches.append({**repo, "branch": branch, "starting_point": payload.get("startingPoint")})
        return httpx2.Response(200, json={})

    def _lfs_batch(self, payload: dict, origin: str) -> httpx2.Response:
        objects = []
        for obj in payload["objects"]:
            answer = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if obj["oid"] not in self.lfs_uploads:  # no "actions" = already present, nothing to upload
                answer["actions"] = {"upload": {"href": f"{origin}{_LFS_STORAGE}{obj['oid']}"}}
            objects.append(answer)
        return httpx2.Response(200, json={"transfer": "basic", "objects": objects})

    def _commit(self, repo: dict, revision: str, request: httpx2.Request, origin: str) -> httpx2.Response:
        lines = [json.loads(line) for line in request.content.splitlines() if line.strip()]
        header = next(line["value"] for line in lines if line["key"] == "header")
        values = {key: [line["value"] for line in lines if line["key"] == key] for key in ("file", "lfsFile")}
        contents = {f["path"]: base64.b64decode(f["content"]) for f in values["file"]}
        files = {path: len(content) for path, content in contents.items()}
        files.update({f["path"]: f["size"] for f in values["lfsFile"]})
        deleted = [line["value"]["path"] for line in lines if line["key"] in ("deletedFile", "deletedFolder")]
        oid = hashlib.sha1(request.content).hexdigest()
        self.commits.append(
            {
                **repo,
                "revision": revision,
                "message": header["summary"],
                "description": header.get("description", ""),
                "parent_commit": header.get("parentCommit"),
                "files": files,
                "contents": contents,
                "lfs_files": sorted(f["path"] for f in values["lfsFile"]),
                "deleted": deleted,
                "oid": oid,
            }
        )
        repo_url = f"{origin}/{constants.REPO_TYPES_URL_PREFIXES.get(repo['repo_type'], '')}{repo['repo_id']}"
        pr_url = f"{repo_url}/discussions/1" if request.url.params.get("create_pr") == "1" else None
        return httpx2.Response(
            200, json={"commitUrl": f"{repo_url}/commit/{oid}", "commitOid": oid, "pullRequestUrl": pr_url}
        )


def _upload_mode(file: dict) -> dict:
    sample = base64.b64decode(file["sample"])
    lfs = b"\0" in sample or file["size"] >= 10 * 1024 * 1024 or file["path"].lower().endswith(LFS_SUFFIXES)
    return {"path": file["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": None}


def _error(status: int, message: str, **extra: Any) -> httpx2.Response:
    return httpx2.Response(status, json={"error": message, **extra})


@contextlib.contextmanager
def record_hub_requests() -> Iterator[HubRecorder]:
    """Answer every huggingface_hub HTTP call with an in-process fake Hub; yields the `HubRecorder`.

    >>> from huggingface_hub import HfApi
    >>> with record_hub_requests() as hub:
    ...     _ = HfApi().create_repo("user/name", private=True)
    >>> hub.created_repos
    [{'repo_id': 'user/name', 'repo_type': 'model', 'private': True}]
    """
    hub = HubRecorder()
    transport = httpx2.MockTransport(hub.handle)
    saved_env = {name: os.environ.get(name) for name in ("HF_TOKEN", "HF_OIDC_RESOURCE")}
    saved = (_http._GLOBAL_CLIENT_FACTORY, _http._GLOBAL_ASYNC_CLIENT_FACTORY, constants.HF_HUB_DISABLE_XET)
    os.environ["HF_TOKEN"] = FAKE_TOKEN
    os.environ.pop("HF_OIDC_RESOURCE", None)
    constants.HF_HUB_DISABLE_XET = True
    set_client_factory(lambda: httpx2.Client(transport=transport, trust_env=False, timeout=None))
    set_async_client_factory(lambda: httpx2.AsyncClient(transport=transport, trust_env=False, timeout=None))
    try:
        yield hub
    finally:
        set_client_factory(saved[0])  # also closes and forgets the fake session (`close_session`)
        set_async_client_factory(saved[1])
        constants.HF_HUB_DISABLE_XET = saved[2]
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
