"""The cluster's private certificate authority and the site's certificate, made with the openssl
command line (Debian's ``openssl`` package) once and reused.

    var/cluster/tls/ca.crt, ca.key          the CA (clients trust ca.crt)
    var/cluster/plk-lb/tls/fullchain.pem    the site's certificate (then the CA's), for the
    var/cluster/plk-lb/tls/privkey.pem      balancer's address and the site's name

The balancer finds its certificate at ``<PLURK_VAR_DIR>/tls/`` (plurksite.nginxconf.site_tls),
where an operator puts theirs (docs/deploy.md, "TLS").  Keys are ECDSA P-256: the cheapest
handshake every client supports.  A certificate is made again when it is missing, expires within a
week, no longer names the site, or was not signed by the CA on disk (the CA was made again).
"""
import os
import subprocess
import tempfile

from . import ClusterError

CA_DAYS = 3650
SITE_DAYS = 825                     # the longest validity clients accept for a leaf
RENEW_BEFORE_S = 7 * 86400
KEY_ARGS = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]


def _openssl(*args, stdin=None):
    try:
        done = subprocess.run(["openssl", *args], input=stdin, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ClusterError("needs the openssl command (apt-get install openssl)") from None
    return done


def _must(*args, stdin=None):
    done = _openssl(*args, stdin=stdin)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ClusterError(f"`openssl {' '.join(args[:2])}` failed: {said[-1] if said else done.returncode}")
    return done.stdout


def _valid(cert, ca_cert=None, names=()):
    """Whether ``cert`` exists, is good for another week, is signed by ``ca_cert`` (when given)
    and names every one of ``names`` (``IP:...``/``DNS:...``)."""
    if not os.path.exists(cert):
        return False
    if _openssl("x509", "-in", cert, "-noout", "-checkend", str(RENEW_BEFORE_S)).returncode != 0:
        return False
    if ca_cert is not None and _openssl("verify", "-CAfile", ca_cert, cert).returncode != 0:
        return False
    if names:
        text = _openssl("x509", "-in", cert, "-noout", "-ext", "subjectAltName").stdout
        listed = {part.strip().replace("IP Address:", "IP:") for part in text.replace("\n", ",").split(",")}
        if not set(names) <= listed:
            return False
    return True


def ensure_ca(directory, name="plurk cluster CA"):
    """The CA in ``directory`` (ca.crt, ca.key 0600), made unless a good one is there; the
    path of ca.crt."""
    os.makedirs(directory, exist_ok=True)
    cert, key = os.path.join(directory, "ca.crt"), os.path.join(directory, "ca.key")
    if os.path.exists(key) and _valid(cert):
        return cert
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        tmp_key, tmp_cert = os.path.join(tmp, "ca.key"), os.path.join(tmp, "ca.crt")
        _must("req", "-x509", *KEY_ARGS, "-nodes", "-keyout", tmp_key, "-out", tmp_cert,
              "-days", str(CA_DAYS), "-subj", f"/CN={name}",
              "-addext", "basicConstraints=critical,CA:true,pathlen:0",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        os.chmod(tmp_key, 0o600)
        os.replace(tmp_key, key)
        os.replace(tmp_cert, cert)
    return cert


def ensure_site(directory, ca_dir, names):
    """The site's certificate and key in ``directory`` (fullchain.pem: the certificate then the
    CA's; privkey.pem, 0600) for ``names`` (``IP:10.77.0.10``, ``DNS:plurk.test``), signed by the
    CA of ``ca_dir``; made unless a good one is there.  (fullchain path, privkey path)."""
    ca_cert = ensure_ca(ca_dir)
    ca_key = os.path.join(ca_dir, "ca.key")
    os.makedirs(directory, exist_ok=True)
    chain, key = os.path.join(directory, "fullchain.pem"), os.path.join(directory, "privkey.pem")
    if os.path.exists(key) and _valid(chain, ca_cert, names):
        return chain, key
    cn = next((n.split(":", 1)[1] for n in names if n.startswith("DNS:")), names[0].split(":", 1)[1])
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        tmp_key, csr, leaf = (os.path.join(tmp, n) for n in ("privkey.pem", "site.csr", "site.crt"))
        _must("req", "-new", *KEY_ARGS, "-nodes", "-keyout", tmp_key, "-out", csr, "-subj", f"/CN={cn}")
        ext = os.path.join(tmp, "ext.cnf")
        with open(ext, "w") as fh:
            fh.write(f"subjectAltName={','.join(names)}\n"
                     "basicConstraints=critical,CA:false\n"
                     "keyUsage=critical,digitalSignature\n"
                     "extendedKeyUsage=serverAuth\n")
        _must("x509", "-req", "-in", csr, "-CA", ca_cert, "-CAkey", ca_key, "-CAcreateserial",
              "-CAserial", os.path.join(tmp, "ca.srl"), "-out", leaf, "-days", str(SITE_DAYS),
              "-extfile", ext)
        os.chmod(tmp_key, 0o600)
        with open(leaf) as fh, open(ca_cert) as ca:
            full = fh.read() + ca.read()
        with open(os.path.join(tmp, "fullchain.pem"), "w") as fh:
            fh.write(full)
        os.replace(tmp_key, key)
        os.replace(os.path.join(tmp, "fullchain.pem"), chain)
    return chain, key
