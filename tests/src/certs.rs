//! Test certificates, made with `rcgen` when a test runs (no key is checked
//! in): a CA, server certificates naming `127.0.0.1`, client certificates
//! naming their client, all written as PEM files into a scratch directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};

/// A certificate authority and the files it issued.
pub struct Pki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

/// A certificate and key written to files.
#[derive(Debug, Clone)]
pub struct Issued {
    /// Certificate (PEM).
    pub cert: PathBuf,
    /// Private key (PEM).
    pub key: PathBuf,
    /// The certificate, DER (to compare with what a peer presents).
    pub der: Vec<u8>,
}

impl Pki {
    /// A new CA named `name`, its certificate written to `dir/NAME-ca.pem`.
    pub fn new(dir: &Path, name: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join(format!("{name}-ca.pem")), cert.pem()).unwrap();
        Pki {
            dir: dir.to_path_buf(),
            issuer: Issuer::new(params, key),
        }
    }

    /// The CA certificate file of a CA made with `name`.
    pub fn ca_file(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}-ca.pem"))
    }

    /// A server certificate for `sans` (IPs or DNS names), written to
    /// `file.pem` / `file.key`.
    pub fn server(&self, file: &str, sans: &[&str], serial: u64) -> Issued {
        self.issue(file, sans, serial, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate naming `sans`, written to `file.pem` / `file.key`.
    pub fn client(&self, file: &str, sans: &[&str], serial: u64) -> Issued {
        self.issue(file, sans, serial, ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(
        &self,
        file: &str,
        sans: &[&str],
        serial: u64,
        eku: ExtendedKeyUsagePurpose,
    ) -> Issued {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.distinguished_name.push(DnType::CommonName, file);
        params.serial_number = Some(SerialNumber::from(serial));
        params.extended_key_usages = vec![eku];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let issued = Issued {
            cert: self.dir.join(format!("{file}.pem")),
            key: self.dir.join(format!("{file}.key")),
            der: cert.der().to_vec(),
        };
        // The key first: a reader between the two writes sees a new key
        // with the old certificate, which must not load.
        std::fs::write(&issued.key, key.serialize_pem()).unwrap();
        std::fs::write(&issued.cert, cert.pem()).unwrap();
        issued
    }
}
