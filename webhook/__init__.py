"""The mutating admission webhook: GPU pods go to the gpu-scheduler profile.

:mod:`webhook.mutate` decides (pure), :mod:`webhook.admission` speaks AdmissionReview
v1 (pure), :mod:`webhook.app` is the Flask app, :mod:`gpu_scheduler.tls` the certificate
reloading SSL context for gunicorn, :mod:`webhook.cli` the command.
"""
