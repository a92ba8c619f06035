"""A registry's v2 API, read-only: what a tag names (manifest, digest, layers and their sizes),
with the login `docker login` stored, and each failure as one line that says what to do.

Used by scripts/pull.py (make pull), scripts/push.py (the zstd check) and
benchmarks/bench_pull.py. Standard library only: make pull runs before any virtualenv exists.
"""
import base64
import binascii
import hashlib
import json
import os
import pathlib
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import registry_tls

# Everything a pull may meet: an index (several platforms) or one image, Docker's or OCI's.
MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
INDEX_TYPES = MANIFEST_TYPES[:2]
TIMEOUT = 20  # seconds per request: a registry that takes longer is as good as unreachable here


class RegistryError(Exception):
    """A failure a user can act on; str() is the one line to print. `status`: the HTTP status
    (None: no answer at all), so callers can tell "not published" (404) from the rest."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class Ref:
    """host/repository:tag or host/repository@sha256:..., split the way Docker splits it."""

    def __init__(self, text):
        self.text = text
        name, self.digest = (text.split("@", 1) + [None])[:2]
        last = name.rsplit("/", 1)[-1]
        self.tag = None
        if ":" in last:
            name, self.tag = name.rsplit(":", 1)
        first = name.split("/", 1)[0]
        if "/" in name and ("." in first or ":" in first or first == "localhost"):
            self.host, self.repository = name.split("/", 1)
        else:  # Docker Hub: docker.io/library/name
            self.host = "registry-1.docker.io"
            self.repository = name if "/" in name else f"library/{name}"
        self.name = name
        if not self.tag and not self.digest:
            self.tag = "latest"

    @property
    def reference(self):
        return self.digest or self.tag

    @property
    def local(self):
        """A registry on this host, which dockerd counts as insecure by default (127.0.0.0/8)."""
        return bool(re.match(r"(127\.|localhost(:|$)|\[::1\])", self.host))

    def at(self, digest):
        return f"{self.name}@{digest}"


def docker_config_path():
    return pathlib.Path(os.environ.get("DOCKER_CONFIG") or pathlib.Path.home() / ".docker") / "config.json"


def docker_config():
    try:
        return json.loads(docker_config_path().read_text())
    except (OSError, ValueError):
        return {}


def credentials(host):
    """(user, secret) that `docker login host` stored, from config.json or its credential
    helper; None when there is no login (anonymous pulls of public images still work)."""
    config = docker_config()
    keys = [host, f"https://{host}", f"https://{host}/v1/"]
    if host == "registry-1.docker.io":
        keys += ["https://index.docker.io/v1/", "docker.io"]
    helper = next((config.get("credHelpers", {}).get(k) for k in keys if k in config.get("credHelpers", {})),
                  config.get("credsStore"))
    for key in keys:
        auth = config.get("auths", {}).get(key, {}).get("auth")
        if auth:
            return _decode_auth(host, auth)
    if helper:
        for key in keys:
            found = _ask_helper(helper, key)
            if found:
                return found
    return None


def _decode_auth(host, auth):
    """config.json's auth: base64 of user:secret, as `docker login` writes it."""
    try:
        user, sep, secret = base64.b64decode(auth, validate=True).decode().partition(":")
    except (binascii.Error, ValueError):
        sep = ""
    if not sep:
        raise RegistryError(f"the login stored for {host} in {docker_config_path()} is not base64 of user:password "
                            f"(its \"auth\" was edited by hand?): docker login {host} again, then run make pull again")
    return user, secret


def _ask_helper(helper, key):
    """(user, secret) from docker-credential-<helper> get; None when it has none for key."""
    name = f"docker-credential-{helper}"
    try:
        out = subprocess.run([name, "get"], input=key, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        found = json.loads(out.stdout)
        return found["Username"], found["Secret"]
    except (ValueError, KeyError, TypeError):
        said = (out.stdout.strip() or out.stderr.strip() or "nothing").splitlines()[0][:120]
        raise RegistryError(f"the credential helper {name} get printed no JSON ({said}): fix the helper (its "
                            f"keyring may be locked or absent), or remove \"credsStore\"/\"credHelpers\" from "
                            f"{docker_config_path()} and docker login again") from None


class Client:
    """One repository on one registry; follows the registry's Bearer token challenge once."""

    def __init__(self, ref, insecure=None):
        """insecure: whether Docker counts the registry as insecure (registry_tls.docker_says_insecure);
        None: Docker's default, loopback only. HTTPS first either way (registry_tls)."""
        self.ref = ref if isinstance(ref, Ref) else Ref(ref)
        self.insecure = self.ref.local if insecure is None else insecure
        self.scheme = "https"
        self.auth = None

    @property
    def base(self):
        return f"{self.scheme}://{self.ref.host}/v2/{self.ref.repository}"

    def _open(self, method, url, headers):
        req = urllib.request.Request(url, method=method, headers={**headers, **({"Authorization": self.auth}
                                                                               if self.auth else {})})
        return urllib.request.urlopen(req, timeout=TIMEOUT, context=registry_tls.context(self.ref.host, self.insecure))

    def request(self, method, path, headers=None):
        """-> (status, headers, body) of a 2xx answer; RegistryError for every other outcome."""
        headers, logged_in, first_failure = headers or {}, False, None
        while True:
            try:
                with self._open(method, f"{self.base}/{path}", headers) as r:
                    return r.status, r.headers, r.read()
            except urllib.error.HTTPError as e:
                if e.code == 401 and not logged_in and self._login(e.headers.get("WWW-Authenticate", "")):
                    logged_in = True
                    continue
                raise self._error(e.code) from None
            except (urllib.error.URLError, OSError, ValueError) as e:
                if self.scheme == "https" and self.insecure:  # Docker's fallback for an insecure registry
                    self.scheme, first_failure = "http", e
                    continue
                raise RegistryError(registry_tls.unreachable(self.ref.host, first_failure or e, self.insecure)) from None

    def _login(self, challenge):
        """Answer a 401's challenge: a Bearer token from its realm (with the stored login, else
        anonymous), or Basic with the stored login. -> True when there is something to retry."""
        creds = credentials(self.ref.host)
        basic = creds and "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
        if challenge.lower().startswith("basic"):
            self.auth = basic
            return bool(basic)
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        if not challenge.lower().startswith("bearer") or "realm" not in params:
            return False
        query = {"scope": f"repository:{self.ref.repository}:pull"}
        if params.get("service"):
            query["service"] = params["service"]
        req = urllib.request.Request(params["realm"] + "?" + urllib.parse.urlencode(query),
                                     headers={"Authorization": basic} if basic else {})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT,
                                        context=registry_tls.context(self.ref.host, self.insecure)) as r:
                answer = json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError):
            return False
        token = answer.get("token") or answer.get("access_token")
        self.auth = token and f"Bearer {token}"
        return bool(token)

    def _error(self, status):
        where = f"{self.ref.host}/{self.ref.repository}:{self.ref.reference}"
        if status in (401, 403):
            return RegistryError(f"the registry {self.ref.host} refused access to {where} ({status}): "
                                 f"docker login {self.ref.host}, then run make pull again", status)
        if status == 404:
            return RegistryError(f"{where} is not published ({status}): check IMAGE, TAG and REGISTRY "
                                 "(make tags lists this checkout's tags), or build it: make build", status)
        if status >= 500:
            return RegistryError(f"the registry {self.ref.host} failed ({status}) on {where}: its own "
                                 "error, not yours; try again later, or ask whoever runs it", status)
        return RegistryError(f"the registry {self.ref.host} answered {status} for {where}", status)

    def manifest(self, reference=None):
        """-> (digest, media type, parsed manifest) of a tag or digest. The digest is the sha256
        of the bytes that arrived; a registry (or proxy) whose Docker-Content-Digest names other
        bytes, or a pinned digest the bytes do not match, is refused."""
        reference = reference or self.ref.reference
        _, headers, body = self.request("GET", f"manifests/{reference}", {"Accept": ", ".join(MANIFEST_TYPES)})
        digest = "sha256:" + hashlib.sha256(body).hexdigest()
        claimed = headers.get("Docker-Content-Digest")
        for expected, who in ((claimed, "the registry says it is"), (reference if reference.startswith("sha256:")
                                                                      else None, "it was asked for as")):
            if expected and expected != digest:
                raise RegistryError(
                    f"{self.ref.name}:{reference}: the manifest that arrived is {digest[:19]}, but {who} "
                    f"{expected[:19]}: a broken registry or a proxy in between; nothing was pulled, "
                    "ask whoever runs the registry (or pin the digest you trust: DIGEST=sha256:...)")
        data = json.loads(body)
        return digest, data.get("mediaType") or headers.get("Content-Type", ""), data

    def image_manifest(self, reference=None, platform=("linux", "amd64")):
        """-> (digest, manifest) of one platform's image: the index's entry for `platform`."""
        digest, media_type, data = self.manifest(reference)
        if media_type in INDEX_TYPES or "manifests" in data:
            entry = next((m for m in data["manifests"] if (m.get("platform", {}).get("os"),
                                                           m.get("platform", {}).get("architecture")) == platform), None)
            if entry is None:
                raise RegistryError(f"{self.ref.text} has no {'/'.join(platform)} image")
            return self.manifest(entry["digest"])[::2]
        return digest, data

    def blob(self, digest):
        return self.request("GET", f"blobs/{digest}")[2]


def layers(manifest):
    """[(digest, compressed size, media type)] of an image manifest's layers."""
    return [(entry["digest"], entry["size"], entry["mediaType"]) for entry in manifest.get("layers", [])]


def is_zstd(manifest):
    return any(media.endswith("+zstd") for _, _, media in layers(manifest))
