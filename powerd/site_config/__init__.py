"""A site's whole configuration from its budgets file: ``powerd site generate``.

``generate.generate_site`` writes, under one folder, what every host of a site needs: the
broker (mosquitto.conf with a TLS listener, the hashed password file with one login per
node and the service logins, the shipped ACL), a CA and the broker's certificate, each
node's agent config, the controllers' (and a tree's coordinator's) configs with their
keys, the operator's key and login, systemd units, Grafana provisioning and a Prometheus
scrape config, and INSTALL.txt saying which folder goes to which host. Secrets (keys,
passwords, the CA) are made once: a second run keeps them and says so. docs/DEPLOY.md.

Modules: ``mosquitto_passwd`` (Mosquitto's ``$7$`` hashes), ``pki`` (the CA and the
broker's certificate), ``secrets_store`` (secrets kept across runs), ``render`` (the text
of every config file), ``generate`` (what goes where).
"""

from powerd.site_config.generate import GeneratedSite, SiteOptions, generate_site

__all__ = ["GeneratedSite", "SiteOptions", "generate_site"]
