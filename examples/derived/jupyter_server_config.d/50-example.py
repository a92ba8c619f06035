# An example Jupyter drop-in, loaded after /etc/jupyter/jupyter_server_config.py (so it wins on
# the same setting): list hidden files such as .env in JupyterLab's file browser.
c = get_config()  # noqa: F821  (Jupyter defines it for config files)
c.ContentsManager.allow_hidden = True
