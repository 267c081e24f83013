"""The certificate tool: a CA and a serving certificate for the admission webhook.

:mod:`certs.build` holds the pure functions (keys, certificates, checks);
:mod:`certs.store` reads and writes the four files; :mod:`certs.cli` is the command.
"""
