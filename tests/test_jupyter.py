"""JupyterLab: auth on by default (token, token file, hashed password), never as root, code runs in
a real kernel, and files it writes on a bind mount belong to the host user."""
import json
import os
import re
import subprocess
import time
import uuid

import pytest
import requests
import websocket
from conftest import SLOWDOWN, jupyter_ready, needs_root, version_row, wait_for_log

TIMEOUT = 30


def api(base, path, token=None, headers=None):
    """GET base+path, with the token in the Authorization header when given."""
    headers = dict(headers or {}, **({"Authorization": f"token {token}"} if token else {}))
    return requests.get(base + path, headers=headers, timeout=TIMEOUT, allow_redirects=False)


def ws_url(base, path, token):
    return base.replace("http://", "ws://") + path + f"?token={token}"


def run_in_kernel(base, token, code, timeout=180):
    """Start a kernel through the REST API, run `code` over its websocket; return its stdout.
    The token goes in a header, for the websocket too: jupyterhub-singleuser ignores ?token= in
    URLs (allow_token_in_url), so tests/test_hub.py uses this through the hub's proxy as well."""
    auth = {"Authorization": f"token {token}"}
    r = requests.post(f"{base}/api/kernels", headers=auth, json={"name": "python3"}, timeout=TIMEOUT)
    assert r.status_code == 201, f"starting a kernel should give 201, got {r.status_code}: {r.text}"
    msg_id, session = uuid.uuid4().hex, uuid.uuid4().hex
    # session_id as JupyterLab sends it (Jupyter warns without one).
    ws = websocket.create_connection(
        base.replace("http://", "ws://") + f"/api/kernels/{r.json()['id']}/channels?session_id={session}",
        header=[f"Authorization: token {token}"], timeout=timeout)
    try:
        ws.send(json.dumps({
            "header": {"msg_id": msg_id, "session": session, "username": "test", "date": "",
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True},
        }))
        out, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = json.loads(ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "error":
                pytest.fail(f"kernel raised {content['ename']}: {content['evalue']}")
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(out)
        pytest.fail(f"kernel did not finish within {timeout}s; output so far: {''.join(out)!r}")
    finally:
        ws.close()


@pytest.fixture(scope="module")
def lab(docker_client, image_ref, module_containers):
    """One container as `docker run IMAGE` starts it (generated token, nothing mounted), shared
    by the tests that only talk to it: each starts its own kernels and terminals, and none
    changes its settings. -> (container, base_url, token). Tests that need their own settings,
    mounts or a restart use start_jupyter."""
    c = docker_client.containers.run(image_ref, detach=True, shm_size="1g",
                                     ports={"8888/tcp": ("127.0.0.1", None)})
    module_containers.append(c)
    return jupyter_ready(c)


def test_api_answers_200_with_the_token(lab):
    """Container should serve the Jupyter API to a client that sends the generated token."""
    _, base, token = lab
    assert token, "the ready line should carry a generated token"
    r = api(base, "/api/contents", token)
    assert r.status_code == 200, f"GET /api/contents with the token should be 200, got {r.status_code}"
    r = requests.get(f"{base}/lab?token={token}", timeout=TIMEOUT)
    assert r.status_code == 200 and "JupyterLab" in r.text, f"the ready line's URL should open Lab, got {r.status_code}"


def test_config_drop_ins_load_beside_the_image_settings(start_jupyter, tmp_path):
    """Container should apply *.json and *.py drop-ins in /etc/jupyter/jupyter_server_config.d
    on top of the image's jupyter_server_config.py, whose settings (token, root_dir) still hold."""
    (tmp_path / "50-hide.json").write_text(json.dumps({"ContentsManager": {"hide_globs": ["*.from-json"]}}))
    (tmp_path / "60-hidden.py").write_text("c.ContentsManager.allow_hidden = True\n")
    tmp_path.chmod(0o755)  # readable by dev, as a drop-in folder in an image would be
    c, base, token = start_jupyter(volumes={str(tmp_path): {"bind": "/etc/jupyter/jupyter_server_config.d", "mode": "ro"}})
    rc, out = c.exec_run(["touch", "/workspace/keep.txt", "/workspace/x.from-json", "/workspace/.dotfile"], user="dev")
    assert rc == 0, out
    r = api(base, "/api/contents", token)
    assert r.status_code == 200, f"the image's token should still be required and work, got {r.status_code}"
    names = {item["name"] for item in r.json()["content"]}
    assert "keep.txt" in names, f"root_dir should still be /workspace: {names}"
    assert "x.from-json" not in names, f"the JSON drop-in (hide_globs) was not applied: {names}"
    assert ".dotfile" in names, f"the Python drop-in (allow_hidden) was not applied: {names}"
    assert api(base, "/api/contents").status_code == 403, "a drop-in should not have turned auth off"


def test_refuses_clients_without_a_valid_token(lab):
    """Container should refuse the API without a token or with a wrong one, and send /lab to login."""
    _, base, _ = lab
    assert api(base, "/api/contents").status_code == 403, "the API without a token should be 403"
    assert api(base, "/api/contents", "wrong").status_code == 403, "a wrong token should be 403"
    r = api(base, "/lab")
    assert r.status_code == 302 and "/login" in r.headers.get("Location", ""), \
        f"/lab without a token should redirect to /login, got {r.status_code} {r.headers.get('Location')}"


def test_logs_have_no_auth_disabled_warning(lab):
    """Container should start Jupyter with auth on: no 'authentication is disabled' warning."""
    c, _, _ = lab
    logs = c.logs().decode(errors="replace")
    assert "authentication is disabled" not in logs.lower(), f"auth must be on:\n{logs}"


def test_jupyter_and_its_kernels_do_not_run_as_root(lab):
    """Container should run JupyterLab and the kernels it starts as the non-root user."""
    c, base, token = lab
    code, out = c.exec_run(["ps", "-o", "uid=,args=", "-C", "jupyter-lab"])
    assert code == 0 and out.strip(), f"jupyter-lab should be running: {out!r}"
    uid = int(out.split()[0])
    assert uid != 0, f"JupyterLab should not run as root: {out!r}"
    ids = run_in_kernel(base, token, "import os; print(os.getuid(), os.geteuid())").split()
    assert ids == ["1000", "1000"], f"the kernel should run as UID 1000, got {ids}"


def test_token_is_in_neither_argv_nor_the_kernel_environment(start_jupyter):
    """Container should keep the token out of `ps` output and out of what kernels inherit."""
    c, base, _ = start_jupyter({"JUPYTER_TOKEN": "tok-" + uuid.uuid4().hex})
    secret = next(e.split("=", 1)[1] for e in c.attrs["Config"]["Env"] if e.startswith("JUPYTER_TOKEN="))
    _, ps = c.exec_run(["ps", "-eo", "args"])
    assert secret not in ps.decode(), "the token should not be on any command line"
    env = run_in_kernel(base, secret, "import os; print(sorted(k for k, v in os.environ.items() if v == "
                        f"{secret!r} or k.startswith('JUPYTER_TOKEN')))")
    assert env.strip() == "[]", f"kernels should not inherit the token, found {env.strip()}"


def test_token_from_env_var(start_jupyter):
    """Container should accept exactly the token given in JUPYTER_TOKEN, and not log it."""
    secret = "env-" + uuid.uuid4().hex
    c, base, generated = start_jupyter({"JUPYTER_TOKEN": secret})
    assert generated is None, "no token should be generated when JUPYTER_TOKEN is set"
    assert secret not in c.logs().decode(), "a token the user chose should not be repeated in the logs"
    assert api(base, "/api/contents", secret).status_code == 200, "JUPYTER_TOKEN should be accepted"
    assert api(base, "/api/contents", secret + "x").status_code == 403, "another token should be refused"


def test_token_from_file(start_jupyter, tmp_path):
    """Container should read the token from JUPYTER_TOKEN_FILE (a mounted secret)."""
    secret = "file-" + uuid.uuid4().hex
    (tmp_path / "token").write_text(secret + "\n")
    _, base, generated = start_jupyter(
        {"JUPYTER_TOKEN_FILE": "/run/secrets/jupyter_token"},
        volumes={str(tmp_path / "token"): {"bind": "/run/secrets/jupyter_token", "mode": "ro"}})
    assert generated is None, "no token should be generated when JUPYTER_TOKEN_FILE is set"
    assert api(base, "/api/contents", secret).status_code == 200, "the file's token should be accepted"
    assert api(base, "/api/contents").status_code == 403, "no token should still be refused"


def _password_hash(start_container, password):
    """A hash of `password` made by jupyter_server.auth.passwd in the image."""
    maker = start_container(["python", "-c", f"from jupyter_server.auth import passwd; print(passwd({password!r}))"],
                            detach=True)
    assert maker.wait(timeout=120 * SLOWDOWN)["StatusCode"] == 0, "passwd() should run in the image"
    hashed = maker.logs(stderr=False).decode().strip().splitlines()[-1]
    assert hashed.startswith("argon2:"), f"passwd() should give an argon2 hash, got {hashed!r}"
    return hashed


def _assert_only_the_password_logs_in(base, good):
    """A wrong password at /login gets no API access; `good` does."""
    for password, expect_in in (("wrong", False), (good, True)):
        s = requests.Session()
        s.get(f"{base}/login", timeout=TIMEOUT)
        r = s.post(f"{base}/login", data={"password": password, "_xsrf": s.cookies.get("_xsrf")},
                   allow_redirects=False, timeout=TIMEOUT)
        status = s.get(f"{base}/api/contents", timeout=TIMEOUT).status_code
        assert (status == 200) is expect_in, \
            f"password {password!r}: login gave {r.status_code}, then the API gave {status}"


def test_hashed_password_logs_in(start_container, start_jupyter):
    """Container should accept a hashed password (made by jupyter_server.auth.passwd) at /login."""
    _, base, generated = start_jupyter({"JUPYTER_PASSWORD_HASH": _password_hash(start_container, "s3cret")})
    assert generated is None, "no token should be generated with a password"
    _assert_only_the_password_logs_in(base, "s3cret")


def test_hashed_password_from_a_file_logs_in(start_container, start_jupyter, tmp_path):
    """Container should read the password hash from JUPYTER_PASSWORD_HASH_FILE (a mounted secret,
    in no environment and not in docker inspect) and accept that password only."""
    (tmp_path / "hash").write_text(_password_hash(start_container, "s3cret") + "\n")
    c, base, generated = start_jupyter(
        {"JUPYTER_PASSWORD_HASH_FILE": "/run/secrets/jupyter_password_hash"},
        volumes={str(tmp_path / "hash"): {"bind": "/run/secrets/jupyter_password_hash", "mode": "ro"}})
    assert generated is None, f"no token should be generated with a password file:\n{c.logs().decode()}"
    _assert_only_the_password_logs_in(base, "s3cret")


def test_plain_password_in_hash_variable_is_refused(run_in_image):
    """Container should refuse a JUPYTER_PASSWORD_HASH that is not a hash, and say how to make one."""
    code, logs = run_in_image(None, environment={"JUPYTER_PASSWORD_HASH": "hunter2"}, timeout=60)
    assert code != 0, f"a plain password should stop the container:\n{logs}"
    assert "jupyter_server.auth import passwd" in logs, f"the fix should be printed:\n{logs}"
    assert "hunter2" not in logs, "the rejected value should not be echoed"


@pytest.mark.parametrize("how", ["env", "file"])
def test_empty_token_is_refused_with_the_fix(run_in_image, tmp_path, how):
    """Container should refuse to start Jupyter with an empty token unless told it is insecure."""
    (tmp_path / "token").write_text("\n")
    kwargs = ({"environment": {"JUPYTER_TOKEN": ""}} if how == "env" else
              {"environment": {"JUPYTER_TOKEN_FILE": "/t"},
               "volumes": {str(tmp_path / "token"): {"bind": "/t", "mode": "ro"}}})
    code, logs = run_in_image(None, timeout=60, **kwargs)
    assert code != 0, f"an empty token should stop the container:\n{logs}"
    assert re.search(r"^ERROR .*token is empty.*JUPYTER_ALLOW_INSECURE=1", logs, re.MULTILINE), \
        f"an ERROR line should explain and name the fix:\n{logs}"
    assert "READY" not in logs, "Jupyter should not have started"


def test_insecure_flag_allows_empty_token_and_says_so_loudly(start_jupyter):
    """Container should serve without auth only with JUPYTER_ALLOW_INSECURE=1, and WARN about it."""
    c, base, _ = start_jupyter({"JUPYTER_TOKEN": "", "JUPYTER_ALLOW_INSECURE": "1"})
    logs = c.logs().decode(errors="replace")
    assert re.search(r"^WARN .*NO AUTHENTICATION", logs, re.MULTILINE), f"a loud WARN line is expected:\n{logs}"
    assert api(base, "/api/contents").status_code == 200, "with the insecure flag no token is needed"


def test_kernel_runs_code_and_sees_torch(lab):
    """Container should run code in a kernel over the REST + websocket API, with torch importable,
    and Jupyter should log no warning or error doing so."""
    c, base, token = lab
    # Only what Jupyter logs from here on: the other tests' refused requests are warnings too.
    before = len(c.logs())
    out = run_in_kernel(base, token, "import torch; print('torch', torch.__version__, 2 + 2)")
    torch_version = version_row()["torch"]  # versions.json
    assert re.search(rf"torch {re.escape(torch_version)}(\+\S+)? 4", out), (
        f"the kernel should import torch {torch_version}, got {out!r}")
    # Jupyter's own lines ([W 2026-...]) and the kernel's ([IPKernelApp] WARNING | ...).
    issues = re.findall(r"^\[[WEC] .*|^\[\w+\] (?:WARNING|ERROR|CRITICAL) .*",
                        c.logs()[before:].decode(errors="replace"), re.MULTILINE)
    assert not issues, f"Jupyter should not warn while serving a kernel: {issues}"


def test_kernels_talk_over_unix_sockets_not_tcp(lab):
    """Container should start kernels on IPC: their five channels are unix sockets in the
    user's private runtime dir, not localhost TCP ports that any process could connect to."""
    _c, base, token = lab
    out = run_in_kernel(base, token, "import json, ipykernel.connect as k;"
                        " print('transport', json.load(open(k.get_connection_file()))['transport'])")
    assert "transport ipc" in out, f"the kernel should use the ipc transport, got {out!r}"


@needs_root
def test_files_made_via_jupyter_on_a_bind_mount_belong_to_the_host_user(start_jupyter, tmp_path):
    """Container should create files on a bind-mounted /workspace as the directory's host owner."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "already-here.txt").write_text("hi")
    os.chown(ws, 4321, 4322)
    _, base, token = start_jupyter(volumes={str(ws): {"bind": "/workspace", "mode": "rw"}})
    listing = api(base, "/api/contents", token).json()
    assert "already-here.txt" in [e["name"] for e in listing["content"]], "Jupyter's root should be /workspace"
    r = requests.put(f"{base}/api/contents/via-api.txt", headers={"Authorization": f"token {token}"},
                     json={"type": "file", "format": "text", "content": "x"}, timeout=TIMEOUT)
    assert r.status_code == 201, f"saving through the contents API should give 201, got {r.status_code}"
    run_in_kernel(base, token, "open('/workspace/via-kernel.txt', 'w').write('y')")
    for name in ("via-api.txt", "via-kernel.txt"):
        st = (ws / name).stat()
        assert (st.st_uid, st.st_gid) == (4321, 4322), f"{name} should belong to 4321:4322, got {st.st_uid}:{st.st_gid}"


def test_terminals_run_bash(lab):
    """Container should open Jupyter terminals with bash."""
    _, base, token = lab
    r = requests.post(f"{base}/api/terminals", headers={"Authorization": f"token {token}"}, timeout=TIMEOUT)
    assert r.status_code == 200, f"creating a terminal should give 200, got {r.status_code}"
    ws = websocket.create_connection(ws_url(base, f"/terminals/websocket/{r.json()['name']}", token), timeout=TIMEOUT)
    try:
        ws.send(json.dumps(["stdin", "echo SHELL_IS_${BASH_VERSINFO[0]}_$(id -un)\r"]))
        seen, deadline = "", time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and not re.search(r"SHELL_IS_\d+_dev", seen):
            msg = json.loads(ws.recv())
            if msg[0] == "stdout":
                seen += msg[1]
        assert re.search(r"SHELL_IS_\d+_dev", seen), f"the terminal should be bash as dev, saw {seen[-500:]!r}"
    finally:
        ws.close()


def test_custom_port(start_jupyter):
    """Container should serve Jupyter on JUPYTER_PORT and print that port in the ready line."""
    c, base, token = start_jupyter({"JUPYTER_PORT": "9999"}, port=9999)
    assert "http://127.0.0.1:9999/lab?token=" in c.logs().decode(), "the ready URL should use the custom port"
    assert api(base, "/api/contents", token).status_code == 200, "Jupyter should answer on 9999"


def test_cross_origin_requests_are_not_allowed(lab):
    """Container should not allow other origins (no allow_origin=*): no CORS grant for a browser
    session, no foreign-origin websocket. (Jupyter does answer cross-origin calls that carry the
    token itself in an Authorization header: whoever holds the token is trusted anyway.)"""
    _, base, token = lab
    browser = requests.Session()
    browser.get(f"{base}/lab?token={token}", timeout=TIMEOUT)  # logs in: sets the session cookie
    r = browser.get(f"{base}/api/contents", timeout=TIMEOUT)
    assert r.status_code == 200, f"the session cookie should authenticate, got {r.status_code}"
    r = browser.get(f"{base}/api/contents", headers={"Origin": "http://evil.example"}, timeout=TIMEOUT)
    assert r.status_code in (403, 404) and "Access-Control-Allow-Origin" not in r.headers, \
        f"a page on another origin must not use the API with the user's cookie: {r.status_code} {r.headers}"
    r = requests.post(f"{base}/api/kernels", headers={"Authorization": f"token {token}"}, timeout=TIMEOUT)
    kernel = r.json()["id"]
    url = base.replace("http://", "ws://") + f"/api/kernels/{kernel}/channels"
    cookie = "; ".join(f"{k}={v}" for k, v in browser.cookies.items())
    with pytest.raises(websocket.WebSocketBadStatusException) as err:
        websocket.create_connection(url, cookie=cookie, origin="http://evil.example", timeout=TIMEOUT)
    assert err.value.status_code == 403, f"a foreign-origin websocket should get 403, got {err.value.status_code}"
    websocket.create_connection(url, cookie=cookie, timeout=TIMEOUT).close()  # same origin: fine


def test_generated_token_is_printed_once_in_the_ready_line(lab):
    """Container should print one ready line with a clickable URL holding the generated token."""
    c, _, token = lab
    logs = wait_for_log(c, r"==> READY", 5)
    lines = [ln for ln in logs.splitlines() if "READY" in ln]
    assert len(lines) == 1, f"exactly one ready line expected: {lines}"
    assert logs.count(token) == 1, "the generated token should appear only in the ready line"
    assert re.search(rf"^INFO .*http://127\.0\.0\.1:8888/lab\?token={token}\b", lines[0]), lines[0]
    assert len(token) >= 32, "the generated token should be long enough to not be guessed"


def test_lab_does_not_phone_home_for_news(lab):
    """Container should default JupyterLab's news feed and update check to off (no outside calls)."""
    _, base, token = lab
    r = api(base, "/lab/api/settings/@jupyterlab/apputils-extension:notification", token)
    assert r.status_code == 200, f"the settings API should answer: {r.status_code}"
    # Overrides become the schema's defaults; the user can still opt in from Settings.
    props = r.json()["schema"]["properties"]
    defaults = {k: props[k]["default"] for k in ("fetchNews", "checkForUpdates")}
    assert defaults == {"fetchNews": "false", "checkForUpdates": False}, \
        f"news and update checks should be off by default: {defaults}"


def test_generated_token_survives_a_restart_of_the_same_container(start_jupyter):
    """Container should keep its generated token across `docker restart`, so open tabs keep working."""
    c, _, token = start_jupyter()
    c.restart(timeout=10)
    logs = wait_for_log(c, r"(?s)==> READY.*==> READY", 120)
    tokens = re.findall(r"/lab\?token=([0-9a-f]+)", logs)
    assert tokens == [token, token], f"the restarted container should reuse its token: {tokens}"


# --- nothing secret in the logs, bad auth settings refused up front ---------------------------

def failing_requests(base, token):
    """Requests that Jupyter answers with an error and logs as a warning, URL included: a missing
    file, a missing kernel (REST and websocket), a wrong token, a form post without _xsrf."""
    requests.get(f"{base}/api/contents/missing-{uuid.uuid4().hex}.ipynb?token={token}", timeout=TIMEOUT)
    requests.delete(f"{base}/api/contents/missing.txt?token={token}", timeout=TIMEOUT)
    requests.get(f"{base}/api/kernels/{uuid.uuid4()}?token={token}", timeout=TIMEOUT)
    requests.get(f"{base}/api/sessions?token={token}x", timeout=TIMEOUT)
    requests.get(f"{base}/files/nothere.txt?token={token}", timeout=TIMEOUT)
    requests.post(f"{base}/login?next=%2Flab%3Ftoken%3D{token}", data={"password": token}, timeout=TIMEOUT)
    with pytest.raises(websocket.WebSocketBadStatusException):
        websocket.create_connection(ws_url(base, f"/api/kernels/{uuid.uuid4()}/channels", token), timeout=TIMEOUT)


@pytest.mark.parametrize("chosen", [True, False], ids=["JUPYTER_TOKEN", "generated"])
def test_token_never_reaches_the_logs_from_failing_requests(request, chosen):
    """Container should redact the token from every log line Jupyter writes for failing requests."""
    env = {"JUPYTER_TOKEN": "chosen-" + uuid.uuid4().hex} if chosen else {}
    # A generated token: the shared container, whose logs also hold the other tests' requests.
    c, base, generated = (request.getfixturevalue("start_jupyter")(env) if chosen
                          else request.getfixturevalue("lab"))
    token = env.get("JUPYTER_TOKEN") or generated
    failing_requests(base, token)
    # The lines are there (so the test sees what Jupyter logged), with the token redacted.
    logs = wait_for_log(c, r"404 GET /api/kernels/[0-9a-f-]+\?token=\[redacted\]", TIMEOUT)
    assert re.search(r"/api/contents/missing-[0-9a-f]+\.ipynb\?token=\[redacted\]", logs), \
        f"the 404 for a missing file should still be logged, token redacted:\n{logs}"
    allowed = 0 if chosen else 1  # a generated token is shown once: in the ready line
    # A wrong token that starts like the real one (token + "x") would count here too.
    assert logs.count(token) == allowed, \
        f"the token appears {logs.count(token)} times in the logs (allowed: {allowed}):\n{logs}"


def test_token_file_that_is_a_directory_is_refused_with_the_fix(run_in_image, tmp_path):
    """Container should name JUPYTER_TOKEN_FILE and the fix when it points to a directory."""
    code, logs = run_in_image(None, timeout=60, environment={"JUPYTER_TOKEN_FILE": "/run/secrets/tok"},
                              volumes={str(tmp_path): {"bind": "/run/secrets/tok", "mode": "ro"}})
    assert code == 64, f"a directory as the token file should stop the container (64), got {code}:\n{logs}"
    assert re.search(r"^ERROR .*JUPYTER_TOKEN_FILE=/run/secrets/tok is a directory.*Fix: ", logs, re.MULTILINE), \
        f"the ERROR should say it is a directory and give the fix:\n{logs}"
    assert "read error" not in logs, f"no raw shell error:\n{logs}"


@pytest.mark.parametrize("bad", ["argon2:garbage", "argon2:$argon2id$v=19$m=10240,t=10,p=8$c2FsdA",
                                 "sha1:abc:not-hex"])
def test_malformed_password_hash_is_refused_at_start(run_in_image, bad):
    """Container should refuse a JUPYTER_PASSWORD_HASH that no password can match, before READY."""
    code, logs = run_in_image(None, timeout=60, environment={"JUPYTER_PASSWORD_HASH": bad})
    assert code == 64, f"a malformed hash should stop the container (64), got {code}:\n{logs}"
    assert re.search(r"^ERROR .*JUPYTER_PASSWORD_HASH is not a valid .* hash.*Fix: .*passwd\(\)", logs, re.MULTILINE), \
        f"the ERROR should name the variable and how to make a hash:\n{logs}"
    assert "READY" not in logs and bad not in logs, f"no start, and the value not echoed:\n{logs}"


def test_jupyter_port_22_with_ssh_on_is_refused_with_the_fix(run_in_image, tmp_path):
    """Container should refuse JUPYTER_PORT=22 while SSH is on, naming both ways out."""
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    code, logs = run_in_image(None, timeout=60, environment={
        "JUPYTER_PORT": "22", "PUBLIC_KEY": key.with_suffix(".pub").read_text().strip()})
    assert code == 64, f"the port conflict should stop the container (64), got {code}:\n{logs}"
    assert re.search(r"^ERROR .*JUPYTER_PORT=22 is sshd's port.*JUPYTER_PORT=8888.*SSHD_ENABLED=0", logs, re.MULTILINE), \
        f"the ERROR should name the conflict and both fixes:\n{logs}"
    assert "is not available" not in logs, f"Jupyter should not have been started:\n{logs}"


def _terminal_env(base, token, names, values):
    """In a new Jupyter terminal: each variable in `names` ('unset' when absent) and how many
    environment entries hold any of `values`, as {'NAME': value, 'hits': 'N'}."""
    r = requests.post(f"{base}/api/terminals", headers={"Authorization": f"token {token}"}, timeout=TIMEOUT)
    assert r.status_code == 200, f"creating a terminal should give 200, got {r.status_code}"
    ws = websocket.create_connection(ws_url(base, f"/terminals/websocket/{r.json()['name']}", token), timeout=TIMEOUT)
    # The values are passed in an encoded form, so the typed command (echoed back) never holds them.
    probe = "".join(f'{n}=[${{{n}-unset}}] ' for n in names)
    patterns = " ".join('-e "$(printf \'' + "".join(f"\\x{b:02x}" for b in v.encode()) + '\')"' for v in values)
    try:
        ws.send(json.dumps(["stdin", f'echo "ENV {probe}hits=[$(env | grep -cF {patterns})]"\r']))
        seen, deadline = "", time.monotonic() + TIMEOUT
        result = re.compile(r"ENV (\w+=\[[^$\]]*\] )+hits=\[\d+\]")
        while time.monotonic() < deadline and not result.search(seen):
            msg = json.loads(ws.recv())
            if msg[0] == "stdout":
                seen += msg[1]
        found = result.search(seen)
        assert found, f"the terminal did not answer the probe: {seen[-800:]!r}"
        return dict(re.findall(r"(\w+)=\[([^\]]*)\]", found.group(0)))
    finally:
        ws.close()


def test_terminals_see_neither_the_token_nor_public_key(start_jupyter, tmp_path):
    """Container should keep JUPYTER_TOKEN and PUBLIC_KEY out of Jupyter terminals' environment."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    public_key = (tmp_path / "k.pub").read_text().strip()
    token = "tok-" + uuid.uuid4().hex
    _, base, _ = start_jupyter({"JUPYTER_TOKEN": token, "PUBLIC_KEY": public_key})
    seen = _terminal_env(base, token, ["JUPYTER_TOKEN", "PUBLIC_KEY", "HOME"],
                         [token, public_key.split()[1]])
    assert seen["HOME"] == "/home/dev", f"the probe should see the terminal's own variables: {seen}"
    assert seen == {"JUPYTER_TOKEN": "unset", "PUBLIC_KEY": "unset", "HOME": "/home/dev", "hits": "0"}, (
        f"a Jupyter terminal sees the token or the SSH key: {seen}")


@pytest.mark.parametrize("name,text", [
    ("50-broken.py", "c.ServerApp.allow_hidden = True\nthis is not python\n"),
    ("50-broken.json", '{"ServerApp": {"allow_hidden": true,}\n'),
], ids=["py-syntax-error", "json-invalid"])
def test_a_broken_drop_in_is_named_and_skipped_and_auth_and_address_hold(start_jupyter, tmp_path, name, text):
    """Container should name a Jupyter drop-in that does not load and skip it, while Jupyter still
    listens on the published port and requires the user's token (a broken drop-in once made it
    drop the image's whole config: 127.0.0.1 only, JUPYTER_TOKEN ignored, yet READY)."""
    (tmp_path / name).write_text(text)
    (tmp_path / "60-good.py").write_text("c.ContentsManager.allow_hidden = True\n")
    tmp_path.chmod(0o755)
    token = "tok-" + uuid.uuid4().hex
    c, base, _ = start_jupyter({"JUPYTER_TOKEN": token},
                               volumes={str(tmp_path): {"bind": "/etc/jupyter/jupyter_server_config.d", "mode": "ro"}})
    try:
        status = api(base, "/api/contents", token).status_code
    except requests.ConnectionError as e:
        status = f"no answer ({e.__class__.__name__})"
    assert status == 200, (f"the published port should serve Jupyter with the user's token despite "
                           f"the broken {name}, got {status}:\n{c.logs().decode(errors='replace')}")
    assert api(base, "/api/contents").status_code == 403, "without the token the API should be refused"
    logs = c.logs().decode(errors="replace")
    assert re.search(rf"^ERROR .*drop-in /etc/jupyter/jupyter_server_config.d/{re.escape(name)} is broken"
                     r" and was skipped.*Fix: ", logs, re.MULTILINE), f"an ERROR should name {name}:\n{logs}"
    c.exec_run(["touch", "/workspace/.dot"], user="dev")
    names = {item["name"] for item in api(base, "/api/contents", token).json()["content"]}
    assert ".dot" in names, f"the good drop-in beside the broken one should still apply: {names}"


def test_the_log_redactor_runs_as_the_user_not_root(start_jupyter):
    """Container should run jupyter-log-redact (which filters Jupyter's output) as the user
    Jupyter runs as, never as root."""
    c, _, _ = start_jupyter()
    _, out = c.exec_run(["bash", "-c", "ps -eo user:16,args | grep '[j]upyter-log-redact'"])
    users = [line.split()[0] for line in out.decode().splitlines()]
    assert users == ["dev"], f"the redactor should run once, as dev: {out.decode()!r}"


@pytest.mark.parametrize("shape", ["{}\nsecond-line", "{}\r", "{}\tx"], ids=["newline", "cr", "tab"])
def test_token_with_a_line_break_is_refused_with_the_fix(run_in_image, shape):
    """Container should refuse a JUPYTER_TOKEN holding a line break or another control character
    (a two-line token no browser can send), without echoing it, and start nothing."""
    secret = "tok" + uuid.uuid4().hex
    code, logs = run_in_image(None, environment={"JUPYTER_TOKEN": shape.format(secret)}, timeout=60)
    assert code == 64, f"the token should stop the container with 64, got {code}:\n{logs}"
    assert re.search(r"^ERROR .*JUPYTER_TOKEN holds a line break.*Fix: ", logs, re.MULTILINE), (
        f"an ERROR should say what is wrong and the fix:\n{logs}")
    assert "READY" not in logs and secret not in logs, f"nothing should start or echo the token:\n{logs}"


@pytest.mark.parametrize("token", ["a", "1234", "fifteen-chars-x"], ids=["1-char", "4-digits", "15-chars"])
def test_a_token_too_short_to_resist_guessing_is_refused_with_the_fix(run_in_image, token):
    """Container should refuse a JUPYTER_TOKEN under 16 characters (Jupyter has no rate limit:
    "1234" on a published port is guessed in seconds), say how long it is and the fix, without
    echoing it, and start nothing."""
    code, logs = run_in_image(None, environment={"JUPYTER_TOKEN": token}, timeout=60)
    assert code == 64, f"a {len(token)}-character token should stop the container with 64, got {code}:\n{logs}"
    assert re.search(rf"^ERROR .*JUPYTER_TOKEN has {len(token)} characters, fewer than 16.*Fix: ", logs,
                     re.MULTILINE), f"an ERROR should say what is wrong and the fix:\n{logs}"
    assert "READY" not in logs, f"nothing should start:\n{logs}"
