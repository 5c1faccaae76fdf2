/**
 * `dsec fleet cert --ca DIR --role host|gateway|client --name NAME [--san NAME|IP]...
 * [--days N] --out PREFIX`: issues a certificate of the fleet CA in DIR and writes
 * `PREFIX.crt` (0644) and `PREFIX.key` (0600). The role is in a URI SAN
 * `dsec:role:ROLE` (and the subject's OU), which dsecd and the gateway check
 * (docs/SECURITY.md "Fleet identity"). Host and gateway certificates serve TLS and
 * authenticate as clients; their SANs should name every address they are reached at
 * (NAME itself is added as a DNS name when it looks like one). Client certificates only
 * authenticate. Runs locally, without dsecd. Prints the two paths, or
 * `{cert, key, role, name, sans}` with --json.
 */
import type { Command } from 'commander';
import { existsSync } from 'node:fs';
import net from 'node:net';
import { CERT_ROLES, issueCert, loadFleetCa, writeAtomic, type CertRole } from '../../../pki/certs.js';
import type { Ctx } from '../../util/context.js';
import { UserError } from '../../util/errors.js';
import { writeJson } from '../../util/output.js';
import { flag, parsePositiveInt } from '../../util/parse.js';
import { asUserError } from './ca.js';

/** Options of `fleet cert`. */
interface CertOptions {
  role: string;
  name: string;
  san?: string[];
  days: number;
  out: string;
  force?: boolean;
}

/** Adds `cert` to the `fleet` command `parent`. */
export function register(parent: Command, ctx: Ctx): Command {
  return parent
    .command('cert')
    .description('issue a host, gateway or client certificate of a fleet CA: PREFIX.crt and PREFIX.key')
    .addHelpText('after', '\n--ca DIR (required) names the fleet CA directory of `dsec fleet ca`: the global --ca option, read here as that directory.')
    .requiredOption('--role <role>', `what the certificate is: ${CERT_ROLES.join(', ')}`)
    .requiredOption('--name <name>', 'its name (common name): a host name, a gateway name, a person or controller')
    .option('--san <name>', 'a DNS name or IP address it is valid for (repeatable)', (v: string, prev: string[] = []) => [...prev, v])
    .option('--days <n>', 'validity in days', flag('--days', parsePositiveInt), 365)
    .requiredOption('--out <prefix>', 'write PREFIX.crt and PREFIX.key')
    .option('--force', 'replace existing PREFIX.crt and PREFIX.key')
    .action(async (opts: CertOptions) => {
      // --ca is a global option (the CA to trust for --host); commander gives it to the root command wherever it stands.
      const caDir = ctx.globals.ca;
      if (!caDir) throw new UserError('dsec fleet cert needs --ca DIR, the fleet CA directory', 'make one with `dsec fleet ca DIR`');
      if (!(CERT_ROLES as readonly string[]).includes(opts.role)) throw new UserError(`--role ${JSON.stringify(opts.role)}: one of ${CERT_ROLES.join(', ')}`);
      const role = opts.role as CertRole;
      const certFile = `${opts.out}.crt`, keyFile = `${opts.out}.key`;
      if (!opts.force && (existsSync(certFile) || existsSync(keyFile))) throw new UserError(`${existsSync(certFile) ? certFile : keyFile} exists`, 'pass --force to replace it, or another --out');
      const sans = opts.san ?? [];
      const ips = sans.filter((s) => net.isIP(s) !== 0);
      const dns = sans.filter((s) => net.isIP(s) === 0);
      if (role !== 'client' && /^[A-Za-z0-9][A-Za-z0-9.-]*$/.test(opts.name) && !dns.includes(opts.name)) dns.unshift(opts.name);
      const ca = await asUserError(async () => loadFleetCa(caDir), 'make one with `dsec fleet ca DIR`');
      const leaf = await asUserError(() => issueCert(ca, { name: opts.name, role, dns, ips, usage: role === 'client' ? ['client'] : ['server', 'client'], days: opts.days }));
      writeAtomic(keyFile, leaf.key, 0o600);
      writeAtomic(certFile, leaf.cert, 0o644);
      if (ctx.json) writeJson(ctx.io.stdout, { cert: certFile, key: keyFile, role, name: opts.name, sans: [...dns, ...ips] });
      else ctx.out(`${certFile}\n${keyFile}\n`);
    });
}
