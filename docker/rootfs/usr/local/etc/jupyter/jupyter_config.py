# The notebook extras' server settings (docs/container.md: Notebook extras), in a file of their own
# beside the auth settings (/etc/jupyter/jupyter_server_config.py, which reads what 40-jupyter.sh writes). Named jupyter_config, not
# jupyter_server_config: `jupyter lab --config=FILE` (how the entrypoint starts it) reads FILE
# *instead of* every jupyter_server_config on the config path, but jupyter_config from every
# config directory always. So every Jupyter server in the image gets these: the one the
# entrypoint starts and jupyterhub-singleuser under a hub alike. (Other Jupyter tools read this
# file too and ignore the settings that are not theirs.)
# ruff: noqa: F821 - `c` is the config object Jupyter defines when it runs this file

# TensorBoard, started on first use by jupyter-server-proxy and served at <base_url>/tensorboard/
# behind Jupyter's own auth (token, password or the hub's OAuth). team-tensorboard makes it
# listen on 127.0.0.1 only, on a port the proxy picks: no published port, no listener beyond
# loopback. absolute_url False: the proxy strips the prefix, and TensorBoard's pages use
# relative URLs, so it needs no --path_prefix of its own.
c.ServerProxy.servers = {
    "tensorboard": {
        "command": ["/usr/local/bin/team-tensorboard", "{port}"],
        # Its first start scans TENSORBOARD_LOGDIR; the default 5 s is too short on a busy host.
        "timeout": 90,
        "absolute_url": False,
        "new_browser_tab": False,
        "launcher_entry": {
            "enabled": True,
            "title": "TensorBoard",
            "icon_path": "/usr/local/share/team/tensorboard.svg",
            "category": "Notebook",
        },
    },
}
