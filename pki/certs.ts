/**
 * X.509 for dsecd's TCP door, the fleet and the CLI (`dsec fleet`), below daemon/ and
 * cli/ so both use it: certificate authorities, server and client
 * certificates, and the role a certificate names.
 *
 * Keys are ECDSA P-256 with SHA-256 signatures (WebCrypto through @peculiar/x509), which
 * every TLS 1.3 stack takes; files are PEM (certificates `CERTIFICATE`, keys PKCS#8
 * `PRIVATE KEY`).
 *
 * A fleet certificate names its role in a URI subject alternative name `dsec:role:ROLE`
 * (ROLE one of {@link CERT_ROLES}), the one place dsecd reads it from; the subject's OU
 * repeats it for people reading `openssl x509 -text`. A certificate with no role URI, or
 * with more than one, has no role ({@link peerIdentity} gives `role: null`).
 */
import 'reflect-metadata';
import * as x509 from '@peculiar/x509';
import { X509Certificate, randomBytes, webcrypto } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { PeerCertificate } from 'node:tls';
import { CERT_ROLES, type CertRole } from './roles.js';

/**
 * A refusal of the certificate code: a bad name, address or file (`InvalidArgument`), or
 * a CA that already exists (`AlreadyExists`). dsecd turns it into a DsecError of the same
 * kind, the CLI into a user error.
 */
export class PkiError extends Error {
  constructor(readonly kind: 'InvalidArgument' | 'AlreadyExists', message: string) {
    super(message);
    this.name = 'PkiError';
  }
}
const invalidArgument = (m: string) => new PkiError('InvalidArgument', m);
const alreadyExists = (m: string) => new PkiError('AlreadyExists', m);

x509.cryptoProvider.set(webcrypto as unknown as Crypto);

export { CERT_ROLES, type CertRole };
/** Prefix of the URI SAN that names a certificate's role: `dsec:role:gateway`. */
export const ROLE_URI_PREFIX = 'dsec:role:';

/** ECDSA over P-256 with SHA-256 (RFC 5480 / RFC 8446 `ecdsa_secp256r1_sha256`). */
const ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;

/** Certificate names: 1-64 of letters, digits, `.`, `_`, `-`, starting with a letter or digit (a host name fits). */
export const CERT_NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

/** Clock skew allowed between machines: certificates are valid from 5 minutes before they were made. */
const BACKDATE_MS = 5 * 60_000;
const DAY_MS = 86_400_000;

/** A certificate and its private key, PEM. */
export interface CertKeyPem {
  /** The certificate, PEM (`-----BEGIN CERTIFICATE-----`). */
  cert: string;
  /** Its PKCS#8 private key, PEM (`-----BEGIN PRIVATE KEY-----`). */
  key: string;
}

/** A positive random 128-bit serial number, hex (RFC 5280 asks for at most 20 octets, positive). */
function serial(): string {
  const b = randomBytes(16);
  b[0] &= 0x7f;
  b[0] |= 0x01;
  return b.toString('hex');
}

async function newKeys(): Promise<CryptoKeyPair> {
  return (await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as CryptoKeyPair;
}

async function keyPem(k: CryptoKey): Promise<string> {
  return x509.PemConverter.encode(await webcrypto.subtle.exportKey('pkcs8', k), 'PRIVATE KEY');
}

/**
 * Makes a self-signed CA: CA:true with path length 0 (it signs leaf certificates only),
 * key usage keyCertSign and cRLSign.
 * @param name its common name, e.g. `dsec fleet CA` (free text, at most 64 characters)
 * @param days validity in days (default 3,650)
 */
export async function createCa(name: string, days = 3650): Promise<CertKeyPem> {
  if (!name || name.length > 64) throw invalidArgument('CA name: 1-64 characters');
  const keys = await newKeys();
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serial(),
    name: [{ CN: [name] }, { O: ['dsec'] }],
    notBefore: new Date(now - BACKDATE_MS),
    notAfter: new Date(now + days * DAY_MS),
    signingAlgorithm: ALG,
    keys,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return { cert: cert.toString('pem'), key: await keyPem(keys.privateKey) };
}

/** What a leaf certificate covers and may do. */
export interface LeafSpec {
  /** Common name: a host, gateway or client name ({@link CERT_NAME_RE}). */
  name: string;
  /** The fleet role it names (URI SAN `dsec:role:ROLE`), or none (dsecd's own server certificate). */
  role?: CertRole;
  /** DNS names it is valid for (server use). */
  dns?: string[];
  /** IP addresses it is valid for (server use). */
  ips?: string[];
  /** Extended key usages: `server` (TLS server), `client` (TLS client); at least one. */
  usage: Array<'server' | 'client'>;
  /** Validity in days. */
  days: number;
}

/**
 * Issues a leaf certificate signed by `ca` (a CA of {@link createCa}): a fresh P-256 key,
 * CA:false, digitalSignature, the extended key usages asked for, SANs of `spec`.
 * @throws PkiError InvalidArgument for a bad name, address, or a CA key that is not P-256.
 */
export async function issueCert(ca: CertKeyPem, spec: LeafSpec): Promise<CertKeyPem> {
  if (!CERT_NAME_RE.test(spec.name)) throw invalidArgument(`certificate name ${JSON.stringify(spec.name)}: 1-64 of letters, digits, '.', '_', '-', starting with a letter or digit`);
  if (spec.usage.length === 0) throw invalidArgument('a certificate needs a server or client usage');
  for (const ip of spec.ips ?? []) if (net.isIP(ip) === 0) throw invalidArgument(`${JSON.stringify(ip)} is not an IP address`);
  for (const d of spec.dns ?? []) if (!/^[A-Za-z0-9*]([A-Za-z0-9.-]{0,252})$/.test(d)) throw invalidArgument(`${JSON.stringify(d)} is not a DNS name`);
  const caCert = new x509.X509Certificate(ca.cert);
  let caKey: CryptoKey;
  try {
    caKey = await webcrypto.subtle.importKey('pkcs8', x509.PemConverter.decodeFirst(ca.key), ALG, false, ['sign']) as CryptoKey;
  } catch (e) {
    throw invalidArgument(`the CA key is not an ECDSA P-256 PKCS#8 key: ${(e as Error).message}`);
  }
  const keys = await newKeys();
  const now = Date.now();
  const sans: x509.JsonGeneralName[] = [
    ...(spec.dns ?? []).map((v) => ({ type: 'dns' as const, value: v })),
    ...(spec.ips ?? []).map((v) => ({ type: 'ip' as const, value: v })),
    ...(spec.role ? [{ type: 'url' as const, value: `${ROLE_URI_PREFIX}${spec.role}` }] : []),
  ];
  const eku: string[] = [];
  if (spec.usage.includes('server')) eku.push(x509.ExtendedKeyUsage.serverAuth);
  if (spec.usage.includes('client')) eku.push(x509.ExtendedKeyUsage.clientAuth);
  const subject: x509.JsonName = [{ CN: [spec.name] }, ...(spec.role ? [{ OU: [spec.role] }] : []), { O: ['dsec'] }];
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial(),
    subject,
    issuer: caCert.subjectName,
    notBefore: new Date(now - BACKDATE_MS),
    notAfter: new Date(now + spec.days * DAY_MS),
    signingAlgorithm: ALG,
    publicKey: keys.publicKey,
    signingKey: caKey,
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension(eku, false),
      ...(sans.length ? [new x509.SubjectAlternativeNameExtension(sans, false)] : []),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
      await x509.AuthorityKeyIdentifierExtension.create(caCert),
    ],
  });
  return { cert: cert.toString('pem'), key: await keyPem(keys.privateKey) };
}

/** The identity a verified client certificate carries. */
export interface PeerIdentity {
  /** Its subject common name. */
  name: string;
  /** The role of its `dsec:role:` URI SAN; null when it names none, or more than one. */
  role: CertRole | null;
  /** SHA-256 fingerprint (`AB:CD:...`), for logs and the audit log. */
  fingerprint256: string;
}

/**
 * The role named by a SAN string as Node reports it (`DNS:a, URI:dsec:role:host`):
 * exactly one `dsec:role:` URI with a known role, else null.
 */
export function roleOfSan(subjectaltname: string | undefined): CertRole | null {
  if (!subjectaltname) return null;
  const roles = subjectaltname.split(', ')
    .filter((s) => s.startsWith(`URI:${ROLE_URI_PREFIX}`))
    .map((s) => s.slice(`URI:${ROLE_URI_PREFIX}`.length));
  if (roles.length !== 1) return null;
  return (CERT_ROLES as readonly string[]).includes(roles[0]) ? (roles[0] as CertRole) : null;
}

/** The identity of a peer certificate (tls.TLSSocket.getPeerCertificate()); null when there is none. */
export function peerIdentity(c: PeerCertificate | null | undefined): PeerIdentity | null {
  if (!c || !c.raw || c.raw.length === 0) return null;
  const cn = c.subject?.CN;
  return { name: Array.isArray(cn) ? cn[0] : (cn ?? ''), role: roleOfSan(c.subjectaltname), fingerprint256: c.fingerprint256 };
}

/** Reads a PEM file. @throws PkiError InvalidArgument naming the file when it is missing or holds no PEM block of `label`. */
export function readPem(file: string, label: 'CERTIFICATE' | 'PRIVATE KEY', what: string): string {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    throw invalidArgument(`${what} ${file}: ${(e as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (e as Error).message}`);
  }
  if (!text.includes(`-----BEGIN ${label}-----`) && !(label === 'PRIVATE KEY' && /-----BEGIN [A-Z ]*PRIVATE KEY-----/.test(text))) {
    throw invalidArgument(`${what} ${file}: no PEM ${label} in it`);
  }
  return text;
}

/** Writes `text` to `file` with `mode` through a temporary file and a rename, so a reader never sees half of it. */
export function writeAtomic(file: string, text: string, mode: number): void {
  const tmp = `${file}.tmp-${process.pid}`;
  writeFileSync(tmp, text, { mode });
  chmodSync(tmp, mode);
  renameSync(tmp, file);
}

/** File names of a fleet CA directory (`dsec fleet ca DIR`). */
export const FLEET_CA_FILES = { cert: 'ca.crt', key: 'ca.key' } as const;

/**
 * Makes a fleet CA in `dir` (created 0700 if missing): `ca.crt` (0644) and `ca.key`
 * (0600). Refuses to replace an existing CA: every certificate it signed would stop
 * being trusted.
 * @throws PkiError AlreadyExists when `dir` already holds a ca.key or ca.crt.
 */
export async function makeFleetCa(dir: string, name = 'dsec fleet CA', days = 3650): Promise<{ cert: string; key: string }> {
  const cert = path.join(dir, FLEET_CA_FILES.cert), key = path.join(dir, FLEET_CA_FILES.key);
  if (existsSync(cert) || existsSync(key)) throw alreadyExists(`${dir} already holds a CA (${existsSync(key) ? key : cert}); certificates it signed trust it: remove it by hand to start over`);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const ca = await createCa(name, days);
  writeAtomic(key, ca.key, 0o600);
  writeAtomic(cert, ca.cert, 0o644);
  return { cert, key };
}

/** Loads the CA of a fleet CA directory. @throws PkiError InvalidArgument when a file is missing. */
export function loadFleetCa(dir: string): CertKeyPem {
  return {
    cert: readPem(path.join(dir, FLEET_CA_FILES.cert), 'CERTIFICATE', 'fleet CA certificate'),
    key: readPem(path.join(dir, FLEET_CA_FILES.key), 'PRIVATE KEY', 'fleet CA key'),
  };
}

/** The names a host's own server certificate covers by default: its host name, `localhost`, and every address of its interfaces (link-local IPv6 left out: a SAN holds no zone). */
export function hostNames(): { dns: string[]; ips: string[] } {
  const dns = [...new Set([os.hostname(), 'localhost'].filter((n) => /^[A-Za-z0-9.-]+$/.test(n)))];
  const ips = new Set<string>(['127.0.0.1', '::1']);
  for (const list of Object.values(os.networkInterfaces())) {
    for (const a of list ?? []) if (!(a.family === 'IPv6' && a.address.toLowerCase().startsWith('fe80'))) ips.add(a.address);
  }
  return { dns, ips: [...ips] };
}

/** Files of dsecd's own TLS material under `<root>/tls` (see {@link ensureServerCert}). */
export const SERVER_TLS_FILES = { caCert: 'ca.crt', caKey: 'ca.key', cert: 'server.crt', key: 'server.key' } as const;

/** A server certificate is issued again when it has fewer than this many days left (30). */
const RENEW_DAYS = 30;

/**
 * dsecd's own TLS material when no `--tls-cert`/`--tls-key` is given: on first start a
 * CA (`<dir>/ca.crt` 0644, `<dir>/ca.key` 0600, the directory 0711) and a server
 * certificate signed by it (`server.crt`, `server.key` 0600) covering `names`. On later
 * starts the server certificate is kept while it covers every name and has 30 days left,
 * else issued again by the same CA, so clients keep trusting `ca.crt` across address
 * changes and renewals (this is why the CA key is kept rather than discarded: it never
 * leaves the host, and root on the host controls dsecd anyway).
 * @returns the PEMs to serve and the CA certificate file clients trust.
 */
export async function ensureServerCert(dir: string, names: { dns: string[]; ips: string[] }, serverDays = 365): Promise<{ cert: string; key: string; caFile: string; issued: boolean }> {
  mkdirSync(dir, { recursive: true, mode: 0o711 });
  chmodSync(dir, 0o711);
  const f = (k: keyof typeof SERVER_TLS_FILES) => path.join(dir, SERVER_TLS_FILES[k]);
  if (!existsSync(f('caKey')) || !existsSync(f('caCert'))) {
    const ca = await createCa(`dsecd ${os.hostname().slice(0, 40)} CA`);
    writeAtomic(f('caKey'), ca.key, 0o600);
    writeAtomic(f('caCert'), ca.cert, 0o644);
  }
  const ca: CertKeyPem = { cert: readFileSync(f('caCert'), 'utf8'), key: readFileSync(f('caKey'), 'utf8') };
  if (existsSync(f('cert')) && existsSync(f('key'))) {
    const cur = readFileSync(f('cert'), 'utf8');
    if (covers(cur, ca.cert, names, RENEW_DAYS)) return { cert: cur, key: readFileSync(f('key'), 'utf8'), caFile: f('caCert'), issued: false };
  }
  const name = CERT_NAME_RE.test(os.hostname()) ? os.hostname() : 'dsecd';
  const leaf = await issueCert(ca, { name, dns: names.dns, ips: names.ips, usage: ['server'], days: serverDays });
  writeAtomic(f('key'), leaf.key, 0o600);
  writeAtomic(f('cert'), leaf.cert, 0o644);
  return { cert: leaf.cert, key: leaf.key, caFile: f('caCert'), issued: true };
}

/** Whether `certPem` was issued by `caPem`, is valid `minDays` from now, and covers every name of `names`. */
export function covers(certPem: string, caPem: string, names: { dns: string[]; ips: string[] }, minDays: number): boolean {
  try {
    const c = new X509Certificate(certPem);
    const ca = new X509Certificate(caPem);
    if (!c.checkIssued(ca) || !c.verify(ca.publicKey)) return false;
    if (new Date(c.validTo).getTime() < Date.now() + minDays * DAY_MS) return false;
    return names.dns.every((d) => c.checkHost(d, { wildcards: false }) === d) && names.ips.every((ip) => c.checkIP(ip) === ip);
  } catch {
    return false;
  }
}
