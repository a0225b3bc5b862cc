"""Fixtures shared by several test packages."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    import trustme

    d = tmp_path_factory.mktemp("pki")
    ca, other_ca = trustme.CA(), trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = {"cert": d / "cert.pem", "key": d / "key.pem", "ca": d / "ca.pem",
             "other_ca": d / "other.pem"}
    cert.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    cert.private_key_pem.write_to_path(str(paths["key"]))
    ca.cert_pem.write_to_path(str(paths["ca"]))
    other_ca.cert_pem.write_to_path(str(paths["other_ca"]))
    return {k: str(v) for k, v in paths.items()}
