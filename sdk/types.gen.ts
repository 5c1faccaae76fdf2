/**
 * The dsecd API's wire types, generated from docs/api/openapi.json by scripts/sdk-types.mjs
 * (openapi-typescript). Do not edit: change daemon/api/schema.ts and run `npm run openapi`.
 * Friendly names and docs for SDK callers are in sdk/types.ts.
 */
export type paths = Record<string, never>;
export type webhooks = Record<string, never>;
export interface components {
    schemas: {
        AckRequest: {
            ids: string[];
        };
        AckResult: {
            /** @description How many of the ids were held (the others were acknowledged already, reaped or unknown). */
            acknowledged: number;
        };
        /**
         * @description Isolation tier.
         * @enum {string}
         */
        Backend: "container" | "fncall" | "microvm" | "vm";
        BatchItemResult: {
            /** @description The running sandbox, when it was made (or, with a key seen before, was made by the first request). */
            sandbox?: components["schemas"]["Sandbox"];
            /** @description When not made: the error a single create would have answered (e.g. ResourceExhausted when admission or the tenant quota is full). */
            error?: {
                code: string;
                message: string;
            };
        };
        BootstrapRequest: {
            /**
             * @description Only debian (bookworm minbase) so far.
             * @constant
             */
            distro: "debian";
            /**
             * @description Build a toolkit image instead: the base image (debian:bookworm, bootstrapped first when missing) plus one layer of packages. judge: gcc, g++, libc6-dev (image judge:bookworm).
             * @enum {string}
             */
            toolkit?: "judge";
            /** @description Default debian:bookworm, or the toolkit's image (judge:bookworm). */
            image?: string;
            /** @description Extra packages of the layer being built: on top of minbase (default python3, git), or with toolkit on top of its packages. */
            include?: string[];
        };
        BulkRequest: {
            /** @description Label selector, e.g. job=a,round=3 (required: bulk never means "everything"). */
            selector: string;
            /** @enum {string} */
            action: "pause" | "resume" | "stop" | "destroy" | "set_ttl";
            /** @description set_ttl: seconds from creation, or null to remove. */
            ttl_s?: number | null;
            /** @description stop: grace between SIGTERM and SIGKILL. */
            timeout_ms?: number;
        };
        BulkResponse: {
            results: {
                id: string;
                ok: boolean;
                state?: string;
                reclaim?: components["schemas"]["Reclaim"];
                error?: {
                    code: string;
                    message: string;
                };
            }[];
        };
        CommitRequest: {
            /** @description Name of the new image, name[:tag]. */
            image: string;
            /** @description Extra globs (relative to the sandbox root) to strip. */
            exclude?: string[];
            /** @description Security defaults of the new image; default the sandbox's image's. */
            security?: {
                /** @description System paths read-only even to root inside (`*`/`?` in the last component); default ["/bin","/sbin","/usr","/lib*","/etc"]; ["/"] makes every path read-only but writable_paths; [] turns read-only paths off. */
                readonly_paths?: string[];
                /** @description Paths kept writable: exceptions below read-only paths (e.g. /usr/local), or directories the image lacks (e.g. /work), which dsecd creates before start. Wins over readonly_paths. */
                writable_paths?: string[];
                /** @description Restrict file access with Landlock where the kernel has it (docs/SECURITY.md "Landlock"); default true. */
                landlock?: boolean;
                /** @description Changes to the default seccomp profile for sandboxes of this image (`allow` lifts denials, `deny` adds EPERM denials); a sandbox's own override is applied after it. */
                seccomp?: {
                    allow?: string[];
                    deny?: string[];
                };
            };
        };
        CommitResult: {
            image: components["schemas"]["Image"];
            layer: components["schemas"]["Layer"];
            /** @description Paths removed before packing. */
            stripped: string[];
            /** @description E.g. exclude patterns that matched nothing. */
            warnings: string[];
        };
        ComposeRequest: {
            /** @description Image reference, name[:tag]. */
            image: string;
            /** @description Layer digests, lowest first. */
            layers: string[];
            /** @description Take the config from this image. */
            from?: string;
            config?: {
                /** @description KEY=value entries. */
                env?: string[];
                /** @description Working directory of execs. */
                cwd?: string;
                /** @description Default user, name or uid[:gid]. */
                user?: string;
                /** @description Default command. */
                cmd?: string[];
                /** @description Security defaults for sandboxes of this image: a seccomp override and filesystem options (docs/IMAGES.md "Security defaults"); a create request overrides each field. */
                security?: {
                    /** @description System paths read-only even to root inside (`*`/`?` in the last component); default ["/bin","/sbin","/usr","/lib*","/etc"]; ["/"] makes every path read-only but writable_paths; [] turns read-only paths off. */
                    readonly_paths?: string[];
                    /** @description Paths kept writable: exceptions below read-only paths (e.g. /usr/local), or directories the image lacks (e.g. /work), which dsecd creates before start. Wins over readonly_paths. */
                    writable_paths?: string[];
                    /** @description Restrict file access with Landlock where the kernel has it (docs/SECURITY.md "Landlock"); default true. */
                    landlock?: boolean;
                    /** @description Changes to the default seccomp profile for sandboxes of this image (`allow` lifts denials, `deny` adds EPERM denials); a sandbox's own override is applied after it. */
                    seccomp?: {
                        allow?: string[];
                        deny?: string[];
                    };
                };
            };
        };
        CreateSandboxRequest: {
            /**
             * @description Isolation tier; default container.
             * @default container
             */
            backend?: components["schemas"]["Backend"];
            /**
             * @description Image reference, `name` or `name:tag`; default busybox.
             * @default busybox
             */
            image?: string;
            /** @description CPU limit in cores (fractional); default from config. */
            cpus?: number;
            /** @description Memory limit in bytes; default from config. */
            memory_bytes?: number;
            /** @description Maximum number of processes; default from config. */
            pids?: number;
            /** @description Labels, e.g. {job: "a", round: "3"}; at most 64. */
            labels?: {
                [key: string]: components["schemas"]["labelValue"];
            };
            /** @description Environment for every exec, merged over the image env; at most 128 KiB in all. */
            env?: {
                [key: string]: components["schemas"]["envValue"];
            };
            /** @description Seconds after creation when the sandbox is destroyed. */
            ttl_s?: number;
            /**
             * @description latency (default) or batch: SCHED_IDLE and minimal CPU shares, so batch work never delays latency sandboxes.
             * @enum {string}
             */
            priority?: "latency" | "batch";
            /** @description Pause the sandbox after this many seconds without an exec. */
            idle_timeout_s?: number;
            /** @description Changes to the default seccomp profile (docs/SECURITY.md): `allow` lifts every denial of the named syscalls (e.g. ["ptrace"] for a debugger task), `deny` adds EPERM denials. */
            seccomp?: {
                allow?: string[];
                deny?: string[];
            };
            /** @description Network mode and egress policy; default mode none (loopback only). */
            network?: components["schemas"]["NetworkSpec"];
            /** @description Quota on the writable layer, bytes (at least 16 MiB); default [defaults] disk_bytes (10 GiB). Refused above the store's size, and where the store enforces no quota. */
            disk_bytes?: number;
            /** @description Read-only system paths, writable exceptions, Landlock; defaults from the image, then config. */
            filesystem?: components["schemas"]["FilesystemSpec"];
            /** @description Share of the writable-layer store's device under contention, on the cgroup v2 io.weight scale 1-10000 (kernel default 100); default [defaults] io_weight. Container backend only; whether the host enforces it: host info defences.io_weight. */
            io_weight?: number;
            /** @description Limits on the writable-layer store's device; default [defaults.io_max] (none). Container backend only; what the host enforces (v1: not buffered writes): host info defences.io_max. */
            io_max?: components["schemas"]["IoMax"];
        };
        CreateSandboxesRequest: {
            /** @description How many sandboxes of `spec`, 1-1000; with `spec`, instead of `items`. */
            count?: number;
            /** @description The create request of every sandbox of a `count` batch; default `{}` (busybox container). */
            spec?: components["schemas"]["CreateSandboxRequest"];
            /** @description One create request (as POST /v1/sandboxes takes) per sandbox, 1-1000; instead of `count`. */
            items?: components["schemas"]["CreateSandboxRequest"][];
            /** @description An idempotency key per sandbox, in order (as many as the batch has sandboxes), instead of the `Idempotency-Key` header: the header `K` gives sandbox i the key `K/i`. A gateway sends each host the keys of the items it placed there. */
            keys?: string[];
        };
        CreateSandboxesResult: {
            results: components["schemas"]["BatchItemResult"][];
            /** @description How many entries have a sandbox. */
            created: number;
            /** @description How many entries have an error. */
            failed: number;
        };
        CreateTokenRequest: {
            /** @description The tenant the token acts for. */
            tenant: string;
            /**
             * @description admin: everything, every tenant; user: its tenant, no host-wide operation; reader: reads only; metrics: GET /metrics only.
             * @enum {string}
             */
            role: "admin" | "user" | "reader" | "metrics";
            /** @description Lifetime in seconds; absent or null: never expires. */
            ttl_s?: number | null;
            /** @description Free text shown by GET /v1/tokens. */
            description?: string | null;
        };
        CreatedToken: {
            /** @description 16 hex: the first part of the token text after e2b_. */
            id: string;
            tenant: string;
            /** @enum {string} */
            role: "admin" | "user" | "reader" | "metrics";
            description: string | null;
            created_at: number;
            expires_at: number | null;
            revoked_at: number | null;
            /** @enum {string} */
            state: "active" | "expired" | "revoked";
            /** @description e2b_ + 48 hex; only its hash is kept: it cannot be shown again. */
            token: string;
        };
        DefenceStatus: {
            enforced: boolean;
            detail: string;
        };
        EgressRule: {
            /** @description IPv4 or IPv6 prefix, e.g. `10.0.0.0/8`, `2001:db8::/32`; a bare address means /32 or /128. */
            cidr?: string;
            /** @description DNS name, or `*.` and a name for every name below it; resolved by dsecd. */
            host?: string;
            /** @description Destination ports or "low-high" ranges; default every port. */
            ports?: (number | string)[];
            /**
             * @description Default any.
             * @enum {string}
             */
            protocol?: "tcp" | "udp" | "any";
        };
        ErrorBody: {
            error: {
                /**
                 * @description Error kind; decides the HTTP status.
                 * @enum {string}
                 */
                code: "InvalidArgument" | "Unauthenticated" | "PermissionDenied" | "NotFound" | "AlreadyExists" | "Conflict" | "FailedPrecondition" | "ResourceExhausted" | "Internal" | "Unimplemented" | "Unavailable" | "DeadlineExceeded";
                /** @description Human-readable description naming what failed. */
                message: string;
                /** @description Machine-readable refinement of `code` where a caller must branch on it, e.g. for trajectory steps: `outcome_unknown`, `step_mismatch`, `in_progress`, `out_of_order`, `trajectory_removed` (see docs/TRAJECTORIES.md). */
                reason?: string;
            };
        };
        Event: {
            /** @description ms since the Unix epoch. */
            time: number;
            /** @description e.g. sandbox.created, sandbox.started, sandbox.stopped, sandbox.destroyed, sandbox.failed, sandbox.disk_quota (its writable layer filled its quota), sandbox.disk_pool_full (the writable-layer store is nearly full and the sandbox wrote all of its share of it: its writes fail with EDQUOT below its quota until the store has room; the message gives the numbers of the store), sandbox.writable_path_refused (a create, restore, fork or start refused because a writable path resolves through a symlink to where it must not lead; the message says which), exec.finished. */
            type: string;
            sandbox_id: string | null;
            /** @description The tenant the event belongs to (its sandbox's or lease's); a caller sees only its own tenant's events, an admin every tenant's. */
            tenant?: string;
            state?: components["schemas"]["SandboxState"];
            labels?: {
                [key: string]: string;
            };
            message?: string;
        };
        ExecInfo: {
            /** @description 128-bit random id; only its owner (the uid that started it) and root can use it. */
            exec_id: string;
            sandbox_id: string;
            argv: string[];
            tty: boolean;
            /** @description Whether stdin is open for writing. */
            stdin: boolean;
            /** @enum {string} */
            state: "running" | "exited";
            /** @description pid inside the sandbox. */
            pid: number | null;
            /** @description ms since the Unix epoch. */
            started_at: number;
            finished_at: number | null;
            /** @description 127 not found, 126 not executable, else the exit status; null while running or when killed. */
            exit_code: number | null;
            signal: string | null;
            timed_out: boolean;
            /** @description Why the command could not start, or ended with its sandbox. */
            error: string | null;
            /** @description Bytes of stdout produced so far: the end offset (readable from offset 0 when spooled; a paced session holds only the bytes no reader has taken). */
            stdout_bytes: number;
            stderr_bytes: number;
            /** @description Bytes produced beyond the spool budget and dropped (always 0 when paced). */
            stdout_dropped_bytes: number;
            stderr_dropped_bytes: number;
            /** @description Whether output is paced by its readers rather than spooled (StartExecRequest.paced). */
            paced: boolean;
            /** @description OOM kills in the sandbox's memory cgroup from the command's start to its end: any process, this command's children or (when other commands ran at the same time) theirs; null when the backend cannot see them (a VM guest's own kernel). Null while the command runs. */
            oom_kills: number | null;
        };
        ExecList: {
            execs: components["schemas"]["ExecInfo"][];
        };
        ExecRequest: {
            /** @description Program and arguments; argv[0] is looked up in PATH. */
            argv: string[];
            /** @description Extra environment, merged over the sandbox env; at most 128 KiB. */
            env?: {
                [key: string]: components["schemas"]["envValue"];
            };
            /**
             * Format: starts_with
             * @description Working directory inside the sandbox; default the image cwd.
             */
            cwd?: string;
            /** @description User name or uid[:gid] inside the sandbox; default the image user. */
            user?: string;
            /**
             * Format: base64
             * @description Bytes fed to stdin, base64; stdin is empty otherwise.
             */
            stdin_b64?: string;
            /** @description Kill the command (SIGKILL to its process group) after this many ms. */
            timeout_ms?: number;
            /** @description Record this command as a step of this trajectory (docs/TRAJECTORIES.md); needs `step`. */
            trajectory?: components["schemas"]["TrajectoryId"];
            /** @description Step number within `trajectory`, 0 or more; steps are recorded in increasing order. */
            step?: number;
            /** @description Discard the recorded steps of `trajectory` from `step` on, then run this one (after a Conflict). */
            truncate?: boolean;
        };
        ExecResult: {
            /** @description Exit status, null when killed by a signal. */
            exit_code: number | null;
            /** @description Signal name (e.g. SIGKILL) when killed by one, else null. */
            signal: string | null;
            /** @description Standard output, base64, at most max_output_bytes. */
            stdout_b64: string;
            /** @description Standard error, base64, at most max_output_bytes. */
            stderr_b64: string;
            stdout_truncated: boolean;
            stderr_truncated: boolean;
            /** @description Time from fork to exit inside the sandbox, ms. */
            duration_ms: number;
            /** @description True when the command was killed by SIGKILL while the sandbox's memory cgroup recorded an OOM kill. */
            oom: boolean;
            /** @description OOM kills in the sandbox's memory cgroup from the command's start to its end: any process, this command's children or (when other commands ran at the same time) theirs; null when the backend cannot see them (a VM guest's own kernel). Absent from a replayed trajectory step recorded without it. */
            oom_kills?: number | null;
            /** @description True when timeout_ms elapsed and the command was killed. */
            timed_out: boolean;
            /** @description The trajectory the step belongs to (trajectory execs only). */
            trajectory?: string;
            step?: number;
            /** @description True when this result is the recorded one of an earlier run of the same step and nothing was executed now (trajectory execs only). */
            replayed?: boolean;
        };
        FileStat: {
            path: string;
            /** @enum {string} */
            type: "file" | "dir" | "symlink" | "other";
            /** @description Bytes. */
            size: number;
            /** @description Permission bits. */
            mode: number;
            uid: number;
            gid: number;
            /** @description ms since the Unix epoch. */
            mtime_ms: number;
            /** @description Symlink target. */
            target?: string;
        };
        FilesystemSpec: {
            /** @description System paths read-only even to root inside (`*`/`?` in the last component); default ["/bin","/sbin","/usr","/lib*","/etc"]; ["/"] makes every path read-only but writable_paths; [] turns read-only paths off. */
            readonly_paths?: string[];
            /** @description Paths kept writable: exceptions below read-only paths (e.g. /usr/local), or directories the image lacks (e.g. /work), which dsecd creates before start. Wins over readonly_paths. */
            writable_paths?: string[];
            /** @description Restrict file access with Landlock where the kernel has it (docs/SECURITY.md "Landlock"); default true. */
            landlock?: boolean;
        };
        ForkRequest: {
            /** @description How many sandboxes, 1-256. */
            count: number;
            /** @description Labels of the new sandbox(es); default the source's labels. */
            labels?: {
                [key: string]: components["schemas"]["labelValue"];
            };
            /** @description Merged over the source's sandbox env. */
            env?: {
                [key: string]: components["schemas"]["envValue"];
            };
            cpus?: number;
            memory_bytes?: number;
            pids?: number;
            /** @description Seconds after the new sandbox is created when it is destroyed; default none. */
            ttl_s?: number;
            /** @enum {string} */
            priority?: "latency" | "batch";
            idle_timeout_s?: number;
            /** @description Seccomp override of the new sandbox(es); default none (the default profile). */
            seccomp?: {
                allow?: string[];
                deny?: string[];
            };
            /** @description Network of the new sandbox(es); default the source's. */
            network?: components["schemas"]["NetworkSpec"];
            /** @description Writable-layer quota, bytes; default the source's. */
            disk_bytes?: number;
            /** @description Filesystem options of the new sandbox(es), field by field over the source's. */
            filesystem?: components["schemas"]["FilesystemSpec"];
        };
        ForkResult: {
            /** @description The new sandboxes, all running, in creation order. */
            sandboxes: components["schemas"]["Sandbox"][];
        };
        HostInfo: {
            version: string;
            /** @description Instance name; keys cgroups, runtime state and mounts. */
            instance: string;
            /** @description State directory. */
            root: string;
            socket: string;
            kernel: string;
            cores: number;
            memory_bytes: number;
            cgroup: {
                version: 1 | 2;
                parents: {
                    [key: string]: string;
                };
            };
            runtime: {
                name: string;
                path: string;
                version: string;
            };
            backends: {
                [key: string]: {
                    available: boolean;
                    reason: string | null;
                };
            };
            uid_pool: {
                base: number;
                size: number;
                range_size: number;
                in_use: number;
                free: number;
            };
            /** @description Count by state. */
            sandboxes: {
                [key: string]: number;
            };
            /** @description The fncall worker pools, one per image content. */
            fncall_pools: {
                image: string;
                workers: number;
                idle: number;
                busy: number;
                starting: number;
                queued: number;
                /** @description Calls served since dsecd started. */
                calls: number;
                /** @description Workers replaced (OOM, lost agent, call budget, idle). */
                replaced: number;
            }[];
            /** @description Warm pools of pre-created container sandbox shells ([pool]); empty when none is configured. */
            warm_pools: {
                /** @description Image reference of the [[pool.entries]] entry. */
                image: string;
                /** @enum {string} */
                network: "none" | "allow" | "open";
                /** @description Shells the entry keeps ready. */
                size: number;
                /** @description Shells ready to be claimed now. */
                ready: number;
                /** @description Shells being created (refill runs only while no user create is in flight). */
                filling: number;
                /** @description Creates answered from this pool since dsecd started. */
                claimed: number;
                /** @description Creates of this image and network mode that found no ready shell since dsecd started. */
                misses: number;
                /** @description Shell creations that failed since dsecd started. */
                fill_errors: number;
            }[];
            /** @description Optional features and whether this host has them: filesystem_snapshots, process_checkpoints (CRIU), vm_snapshots (machine snapshots of microVMs: RAM, processes and disk), trajectory_log, kvm (available: microVMs run under KVM; otherwise TCG; reason: the verdict of the KVM probe boot). */
            features: {
                [key: string]: {
                    available: boolean;
                    reason: string | null;
                };
            };
            defences: {
                [key: string]: {
                    enforced: boolean;
                    detail: string;
                };
            };
            /** @description The writable-layer store. */
            storage?: {
                /**
                 * @description Where new sandboxes' writable layers go (daemon/storage/store.ts).
                 * @enum {string}
                 */
                kind: "btrfs" | "xfs" | "host";
                /**
                 * @description How the store limits a layer: btrfs simple quotas, full qgroups, XFS project quota, or not at all.
                 * @enum {string}
                 */
                quota: "squota" | "qgroup" | "prjquota" | "none";
                /** @description The store's image, or the operator's directory ([storage] path); <root>/sandboxes for host. */
                location: string;
                /** @description Size of the store filesystem, bytes; null for host. */
                size_bytes: number | null;
                /** @description Bytes used on it (statfs): what quotas, which may add up to more than the size, have actually taken. */
                used_bytes: number | null;
                /** @description Writable layers in the store. */
                layers: number;
                /** @description The store as a shared pool: use against the sum of quotas; null where the store enforces no quota. */
                pool?: {
                    /** @description Bytes writers can still take (statfs f_bavail). */
                    available_bytes: number;
                    /** @description Sum of the disk_bytes quotas of every container sandbox in the store (warm-pool shells included): what the sandboxes may write in all. */
                    quota_sum_bytes: number;
                    /** @description What admission lets the quotas of sandboxes (warm-pool shells excepted) sum to: size_bytes x disk_overcommit. */
                    quota_cap_bytes: number;
                    /** @description [admission] disk_overcommit. */
                    disk_overcommit: number;
                    /** @description Free space kept for sandboxes that are not filling the store ([storage] reserve_bytes; 0: no pool guard). */
                    reserve_bytes: number;
                    /** @description Sandboxes that wrote all of their share of the nearly full store and are held there, below their quota, until it has room again (their events: sandbox.disk_pool_full). */
                    guarded: number;
                    /** @description Sandboxes whose kernel limit the pool guard has set below their quota, to their use plus their share of the free space, because the room above the reserve is less than the headrooms together (the guarded ones included; an idle sandbox is capped too, before it writes). */
                    capped: number;
                } | null;
                /** @description The block device under the store (MAJ:MIN, e.g. a loop device) on which I/O weights and limits act; null: none (host filesystem). */
                device?: string | null;
            };
            /** @description Proactive reclaim of idle container sandboxes by the host ([memory]; daemon/host/memory/). microVMs reclaim inside their guests ([vm.reclaim]). */
            memory_reclaim?: {
                /**
                 * @description [memory] reclaim or dsecd --reclaim: off (default), idle, aggressive.
                 * @enum {string}
                 */
                mode: "off" | "idle" | "aggressive";
                /**
                 * @description How idle container sandboxes are reclaimed here: a kdamond dsecd owns (paddr, memcg filters), cgroup v2 memory.reclaim, cgroup v1 memory.force_empty, or not at all.
                 * @enum {string}
                 */
                method: "damon" | "memory.reclaim" | "memory.force_empty" | "none";
                /** @description Why this method on this host. */
                reason: string;
                damon: {
                    /** @description dsecd owns a kdamond and reclaims with it. */
                    owned: boolean;
                    /** @description What dsecd found of DAMON: no sysfs, a kdamond it did not create (described), or its own. */
                    reason: string;
                };
                /** @description A container sandbox idle this long is reclaimed: no exec running, none started or ended, CPU at most idle_cpu_permil. */
                idle_after_s: number;
                /** @description CPU threshold of idle (at most this), per mille of one core averaged over a sweep. */
                idle_cpu_permil: number;
                /** @description Container sandboxes idle past idle_after_s at the last sweep. */
                idle_sandboxes: number;
                /** @description Bytes reclaimed from idle container sandboxes since dsecd started (DAMON: bytes its schemes paged out; memory cgroups: usage before minus after). */
                reclaimed_bytes: number;
            };
            /** @description Fleet membership (dsecd --etcd; daemon/fleet/); null: no fleet configured. */
            fleet?: {
                /**
                 * @description Registration in etcd: registered (its lease is alive), connecting/lost (etcd unreachable: retrying), refused (its name is held by another host id).
                 * @enum {string}
                 */
                state: "connecting" | "registered" | "refused" | "lost" | "stopped";
                /** @description Why it is not registered, else null. */
                reason: string | null;
                /** @description Persistent host id (16 hex), kept in <root>/fleet/host.json. */
                host_id: string;
                name: string;
                /** @description 6 hex that begin the ids of the sandboxes and snapshots this host creates, so a gateway routes them without a lookup. */
                tag: string;
                /** @description Last successful registration, ms since the epoch. */
                registered_at: number | null;
                lease_ttl_s: number;
            } | null;
        };
        Image: {
            /** @description name:tag */
            ref: string;
            name: string;
            tag: string;
            /** @description Whose name it is: `system` for the shared base images every tenant reads and creates from, else the tenant that made it (seen by that tenant and admins only; its name shadows a system image of the same name for that tenant). */
            tenant: string;
            /** @description Layer digests, lowest first. */
            layers: string[];
            config: components["schemas"]["ImageConfig"];
            /** @description Sum of the layer blob sizes, bytes. */
            size_bytes: number;
            /** @description ms since the Unix epoch. */
            created_at: number;
        };
        ImageConfig: {
            /** @description KEY=value entries. */
            env: string[];
            /** @description Working directory of execs. */
            cwd: string;
            /** @description Default user, name or uid[:gid]. */
            user: string;
            /** @description Default command. */
            cmd: string[];
            /** @description Security defaults for sandboxes of this image: a seccomp override and filesystem options (docs/IMAGES.md "Security defaults"); a create request overrides each field. */
            security?: {
                /** @description System paths read-only even to root inside (`*`/`?` in the last component); default ["/bin","/sbin","/usr","/lib*","/etc"]; ["/"] makes every path read-only but writable_paths; [] turns read-only paths off. */
                readonly_paths?: string[];
                /** @description Paths kept writable: exceptions below read-only paths (e.g. /usr/local), or directories the image lacks (e.g. /work), which dsecd creates before start. Wins over readonly_paths. */
                writable_paths?: string[];
                /** @description Restrict file access with Landlock where the kernel has it (docs/SECURITY.md "Landlock"); default true. */
                landlock?: boolean;
                /** @description Changes to the default seccomp profile for sandboxes of this image (`allow` lifts denials, `deny` adds EPERM denials); a sandbox's own override is applied after it. */
                seccomp?: {
                    allow?: string[];
                    deny?: string[];
                };
            };
        };
        ImageList: {
            images: components["schemas"]["Image"][];
        };
        ImportRequest: {
            /** @enum {string} */
            type: "dir" | "tar" | "oci";
            /**
             * Format: starts_with
             * @description Absolute path on the daemon host.
             */
            path: string;
            /** @description Name for the result, name[:tag]. */
            image: string;
            /** @description dir only: put the new layer on top of this image (its config is kept). */
            base?: string;
            /** @description oci only: which image of a multi-image archive (its ref name, e.g. localhost/app:1). */
            source_ref?: string;
            /** @description Overrides of the image config. */
            config?: {
                /** @description KEY=value entries. */
                env?: string[];
                /** @description Working directory of execs. */
                cwd?: string;
                /** @description Default user, name or uid[:gid]. */
                user?: string;
                /** @description Default command. */
                cmd?: string[];
                /** @description Security defaults for sandboxes of this image: a seccomp override and filesystem options (docs/IMAGES.md "Security defaults"); a create request overrides each field. */
                security?: {
                    /** @description System paths read-only even to root inside (`*`/`?` in the last component); default ["/bin","/sbin","/usr","/lib*","/etc"]; ["/"] makes every path read-only but writable_paths; [] turns read-only paths off. */
                    readonly_paths?: string[];
                    /** @description Paths kept writable: exceptions below read-only paths (e.g. /usr/local), or directories the image lacks (e.g. /work), which dsecd creates before start. Wins over readonly_paths. */
                    writable_paths?: string[];
                    /** @description Restrict file access with Landlock where the kernel has it (docs/SECURITY.md "Landlock"); default true. */
                    landlock?: boolean;
                    /** @description Changes to the default seccomp profile for sandboxes of this image (`allow` lifts denials, `deny` adds EPERM denials); a sandbox's own override is applied after it. */
                    seccomp?: {
                        allow?: string[];
                        deny?: string[];
                    };
                };
            };
        };
        IoMax: {
            /** @description Read bytes per second (at least 4096). */
            read_bps?: number;
            /** @description Written bytes per second (at least 4096). */
            write_bps?: number;
            /** @description Read IOs per second. */
            read_iops?: number;
            /** @description Write IOs per second. */
            write_iops?: number;
        };
        Layer: {
            digest: string;
            /** @description Blob size, bytes. */
            size_bytes: number;
            /** @description When the blob was packed, ms since the Unix epoch; for a caller that is not an admin, when the first image it sees named the layer (content is shared across tenants). */
            created_at: number;
            /** @description Where the content came from, e.g. dir:/path, oci:/x.tar#1, commit:<sandbox id> (for a caller that is not an admin, commit or snapshot alone). */
            source: string;
            /** @description <host>/<instance> that built it. */
            builder: string;
            /** @description Images (name:tag) that use this layer. */
            images: string[];
            /** @description Sandboxes of this instance that use this layer. */
            sandboxes: number;
        };
        LayerList: {
            layers: components["schemas"]["Layer"][];
        };
        LeaseRequest: {
            job: string;
            ttl_s: number;
        };
        LeaseView: {
            /** @description The tenant whose job it is: leases are per (tenant, job). */
            tenant: string;
            job: string;
            ttl_s: number;
            /** @description ms since the epoch; a renewal at or after it is refused. */
            expires_at: number;
            /** @description When the job was paused for lack of renewal. */
            lapsed_at: number | null;
            created_at: number;
            /** @description Sandboxes labelled job=<job>. */
            sandboxes: number;
        };
        MkdirRequest: {
            /**
             * Format: starts_with
             * @description Absolute path inside the sandbox.
             */
            path: string;
            /** @description User inside the sandbox (name or uid[:gid]); default the image user. */
            user?: string;
            mode?: number;
            parents?: boolean;
        };
        NetworkDenials: {
            /** @description connect() calls refused (EPERM). */
            connect: number;
            /** @description UDP sendto/sendmsg calls to an address refused (EPERM). */
            sendmsg: number;
            /** @description Raw or non-TCP/UDP inet sockets refused (EPERM). */
            sock_create: number;
            /** @description DNS questions the resolver refused (REFUSED, never forwarded), for its current container; kept across dsecd restarts (recorded before it is shown). */
            dns_refused: number;
            /** @description The last denied attempt, e.g. `10.0.0.9:80/tcp (connect)`. */
            last: string | null;
        };
        NetworkPolicyList: {
            policies: components["schemas"]["NetworkPolicyView"][];
        };
        NetworkPolicyView: {
            name: string;
            /** @description The data file it was loaded from. */
            file: string;
            description: string | null;
            /** @enum {string} */
            mode: "allow" | "open";
            allow: components["schemas"]["EgressRule"][];
            deny: components["schemas"]["EgressRule"][];
        };
        NetworkSpec: {
            /**
             * @description none (loopback only), allow (allow-list) or open (anything but deny); default the policy's mode, else none.
             * @enum {string}
             */
            mode?: "none" | "allow" | "open";
            /** @description Name of a network policy data file (docs/SECURITY.md), merged under the inline rules. */
            policy?: components["schemas"]["PolicyName"];
            /** @description Destinations reachable in mode allow. */
            allow?: components["schemas"]["EgressRule"][];
            /** @description Destinations never reachable; wins over allow. */
            deny?: components["schemas"]["EgressRule"][];
        };
        PauseResult: {
            sandbox: components["schemas"]["Sandbox"];
            /** @description null when it was already paused. */
            reclaim: components["schemas"]["Reclaim"] | null;
        };
        PolicyName: string;
        PolicyReloadResult: {
            /** @description Every policy loaded now. */
            loaded: string[];
            /** @description Policies whose content changed, appeared or disappeared. */
            changed: string[];
            /** @description Sandboxes whose network was re-applied because their policy changed. */
            reapplied: string[];
            /** @description Shipped policies hidden by an operator policy of the same name (every one in force, not only new ones). */
            shadowed: {
                name: string;
                /** @description The operator's file in force. */
                file: string;
                /** @description The shipped file it hides. */
                shadows: string;
            }[];
            /** @description Allow rules of loaded policies that can never take effect; they do not refuse the reload. */
            warnings: {
                policy: string;
                file: string;
                /** @description Which allow rule (`allow.<index>`) never takes effect and why: inside a destination every sandbox is denied (bridge subnet, host addresses, link-local metadata range, ...), covered by a deny rule of the policy, or in an open policy. */
                message: string;
            }[];
            /** @description Sandboxes naming a policy whose mode this reload changed (each also gets a network.policy_mode_changed event). */
            modes: {
                /** @description Sandbox id. */
                id: string;
                policy: string;
                /**
                 * @description The sandbox's mode now.
                 * @enum {string}
                 */
                mode: "allow" | "open";
                /**
                 * @description The policy's mode after the reload.
                 * @enum {string}
                 */
                policy_mode: "allow" | "open";
                /** @description True when the sandbox took the new mode (its stored network names no mode of its own); false when it keeps the mode settled at its create (PUT its network to change it). */
                changed: boolean;
            }[];
        };
        PruneRequest: {
            dry_run?: boolean;
        };
        PruneResult: {
            removed: {
                digest: string;
                size_bytes: number;
                source: string;
            }[];
            freed_bytes: number;
            /** @description Unreferenced layers kept because they are younger than the grace period. */
            kept_young: string[];
            tmp_removed: number;
            dry_run: boolean;
        };
        Reclaim: {
            memory_before_bytes: number;
            memory_after_bytes: number;
            file_before_bytes: number;
            file_after_bytes: number;
            /** @description Anonymous memory left: reclaimable only with swap/zswap. */
            anon_bytes: number;
            reclaimed_bytes: number;
            swap: boolean;
            note: string;
        };
        RenewRequest: {
            ttl_s?: number;
        };
        ResizeRequest: {
            rows: number;
            cols: number;
        };
        RestoreRequest: {
            /** @description Labels of the new sandbox(es); default the source's labels. */
            labels?: {
                [key: string]: components["schemas"]["labelValue"];
            };
            /** @description Merged over the source's sandbox env. */
            env?: {
                [key: string]: components["schemas"]["envValue"];
            };
            cpus?: number;
            memory_bytes?: number;
            pids?: number;
            /** @description Seconds after the new sandbox is created when it is destroyed; default none. */
            ttl_s?: number;
            /** @enum {string} */
            priority?: "latency" | "batch";
            idle_timeout_s?: number;
            /** @description Seccomp override of the new sandbox(es); default none (the default profile). */
            seccomp?: {
                allow?: string[];
                deny?: string[];
            };
            /** @description Network of the new sandbox(es); default the source's. */
            network?: components["schemas"]["NetworkSpec"];
            /** @description Writable-layer quota, bytes; default the source's. */
            disk_bytes?: number;
            /** @description Filesystem options of the new sandbox(es), field by field over the source's. */
            filesystem?: components["schemas"]["FilesystemSpec"];
        };
        RunBatchRequest: {
            /** @description The calls, 1-1000; they run concurrently. */
            calls: components["schemas"]["RunRequest"][];
        };
        RunBatchResult: {
            results: {
                ok: boolean;
                /** @description When ok. */
                result?: components["schemas"]["ExecResult"];
                /** @description When not ok: why dsec could not run the call (a failing command is ok with its exit code). */
                error?: {
                    code: string;
                    message: string;
                };
            }[];
        };
        RunRequest: {
            /**
             * @description Isolation tier; default container (as for sandboxes); fncall is the fastest isolated execution.
             * @default container
             */
            backend?: components["schemas"]["Backend"];
            /**
             * @description Image reference; default busybox.
             * @default busybox
             */
            image?: string;
            /** @description Program and arguments; argv[0] is looked up in PATH. */
            argv: string[];
            /** @description Extra environment, merged over the sandbox env; at most 128 KiB. */
            env?: {
                [key: string]: components["schemas"]["envValue"];
            };
            /**
             * Format: starts_with
             * @description Working directory inside the sandbox; default the image cwd.
             */
            cwd?: string;
            /** @description User name or uid[:gid] inside the sandbox; default the image user. */
            user?: string;
            /**
             * Format: base64
             * @description Bytes fed to stdin, base64; stdin is empty otherwise.
             */
            stdin_b64?: string;
            /** @description Wall-clock limit, ms: the whole process tree is killed when it passes. Default 60,000 for fncall. */
            timeout_ms?: number;
            /** @description Memory limit, bytes; default from config. */
            memory_bytes?: number;
            /** @description CPU limit, cores (container only; fncall workers share the pool limit). */
            cpus?: number;
            /** @description Process limit (container only; fncall workers have the pool limit). */
            pids?: number;
        };
        Sandbox: {
            /** @description Sandbox id: 16 lowercase hex characters. */
            id: string;
            /** @description The tenant it belongs to (docs/SECURITY.md "Tenancy"): `system` for what the Unix socket made. */
            tenant: string;
            backend: components["schemas"]["Backend"];
            /** @description Image reference as resolved, `name:tag`. */
            image: string;
            /** @description Layer digests of the image, lowest first. */
            image_layers: string[];
            state: components["schemas"]["SandboxState"];
            /** @description CPU limit, cores. */
            cpus: number;
            /** @description Memory limit, bytes. */
            memory_bytes: number;
            /** @description Process limit. */
            pids: number;
            labels: {
                [key: string]: string;
            };
            env: {
                [key: string]: string;
            };
            ttl_s: number | null;
            /** @description Creation time, ms since the Unix epoch. */
            created_at: number;
            /** @description Last state change, ms since the Unix epoch. */
            updated_at: number;
            /** @description Host pid of the sandbox init (the agent), null unless running or paused. */
            init_pid: number | null;
            /** @description First host uid/gid of the sandbox range (container uid 0). */
            uid_base: number | null;
            /** @description Size of the uid/gid range. */
            uid_count: number | null;
            /** @description Why the sandbox failed, when state is failed. */
            error: string | null;
            /** @enum {string} */
            priority: "latency" | "batch";
            idle_timeout_s: number | null;
            /** @description Start of the last exec, ms since the epoch. */
            last_active_at: number | null;
            /** @description Id of the snapshot this sandbox was restored or forked from, else null. */
            snapshot: string | null;
            /** @description The seccomp override it was created with, else null (the default profile). */
            seccomp: {
                allow?: string[];
                deny?: string[];
            } | null;
            /** @description The network it was created with (or last set), else null (mode none). */
            network: components["schemas"]["NetworkSpec"] | null;
            /** @description Quota on the writable layer, bytes, fixed at create; null: none (the store enforces no quota; see defences.disk_quota). */
            disk_bytes: number | null;
            /** @description I/O weight (io.weight scale) applied to its cgroup; null: none (not a container sandbox, or created before I/O settings). */
            io_weight: number | null;
            /** @description I/O limits applied to its cgroup; null: none. */
            io_max: components["schemas"]["IoMax"] | null;
            /** @description Bytes the writable layer uses now, as the store accounts them; null where it cannot tell (layer on the host filesystem). GET of one sandbox only. */
            disk_used_bytes?: number | null;
            /** @description The filesystem options resolved at create (request > image > config), else null (a sandbox older than them: resolved at each start). */
            filesystem: components["schemas"]["FilesystemSpec"] | null;
            /** @description Which defences are in force for this sandbox (GET of one sandbox only). */
            defences?: {
                [key: string]: components["schemas"]["DefenceStatus"];
            };
        };
        SandboxList: {
            sandboxes: components["schemas"]["Sandbox"][];
        };
        SandboxNetwork: {
            id: string;
            /** @enum {string} */
            mode: "none" | "allow" | "open";
            /** @description The named policy merged in, if any. */
            policy: string | null;
            /** @description Effective allow rules: the policy's, then the sandbox's own. */
            allow: components["schemas"]["EgressRule"][];
            /** @description Effective deny rules: the policy's, then the sandbox's own. */
            deny: components["schemas"]["EgressRule"][];
            /** @description The sandbox's IPv4 address on the instance bridge (derived from its uid-range slot), null in mode none. */
            address: string | null;
            gateway: string | null;
            /** @description The resolver its /etc/resolv.conf names, `gateway:53`. */
            resolver: string | null;
            /** @description Whether its veth and egress programs are in place now (running or paused). */
            attached: boolean;
            /** @description Addresses dsecd resolved for each exact host rule (refreshed on the DNS TTL, clamped). */
            hosts: {
                [key: string]: string[];
            };
            /** @description Addresses allowed because the resolver answered them for an allow host rule (wildcards included). */
            learned: number;
            denied: components["schemas"]["NetworkDenials"];
            /** @description Revision of the sandbox's own network spec (16 hex digits, the same for the same spec): give it as PUT's `if_revision` to change the spec only if nobody changed it since. */
            revision: string;
        };
        /** @enum {string} */
        SandboxState: "creating" | "running" | "paused" | "stopped" | "failed" | "destroyed";
        SandboxStatsView: {
            id: string;
            state: components["schemas"]["SandboxState"];
            image: string;
            labels: {
                [key: string]: string;
            };
            created_at: number;
            /** @description CPU limit, cores (as the sandbox was created with). */
            cpus: number;
            cpu_usage_ns: number | null;
            /** @description Memory charged to the sandbox cgroup, bytes. */
            memory_bytes: number | null;
            memory_limit_bytes: number | null;
            pids: number | null;
            oom_kills: number | null;
            /** @description Egress denials of an allow/open sandbox with its network attached, else null. */
            network_denied?: components["schemas"]["NetworkDenials"] | null;
            /** @description Forks refused because the sandbox was at its pids limit (pids.events max). */
            pids_limit_hits?: number | null;
            /** @description null: this sandbox's denials are not counted (no seccomp monitor when it started). */
            seccomp_denials?: {
                /** @description Denied system calls since the sandbox started (counted by the seccomp monitor, across dsecd restarts). */
                total: number;
                /** @description Denials per syscall name. */
                by_syscall: {
                    [key: string]: number;
                };
                /** @description Past the flood limit: later denials still fail (ENOSYS) but are no longer counted. */
                flooded: boolean;
            } | null;
            /** @description Bytes the writable layer uses (any state): btrfs referenced plus reserved data, or the XFS project's blocks; null where the store cannot tell (host filesystem). In GET /v1/stats read for all layers at once, as of the store's last commit (btrfs: at most 30 s old). */
            disk_used_bytes: number | null;
            /** @description The writable layer's quota as the filesystem holds it, bytes; null: none. */
            disk_limit_bytes: number | null;
            /** @description Container sandboxes, while the host's reclaim runs ([memory] reclaim): idle since (no exec, CPU at most idle_cpu_permil), ms since the epoch, as of its last sweep; null: busy, or not judged (other tiers, reclaim off). */
            idle_since?: number | null;
            /** @description Bytes the host's reclaim took back from this sandbox since dsecd started (GET /v1/host memory_reclaim). */
            reclaimed_bytes?: number;
        };
        SeccompProfileInfo: {
            /** @description The profile data file ([security] seccomp_profile). */
            file: string;
            /** @description sha256 of the file as loaded, hex. */
            sha256: string;
            /** @description Distinct syscall names the profile denies (unconditionally or by argument). */
            denied: number;
            /** @description Core syscalls (bpf, the mount family, keyctl, ptrace, ...) the profile does not deny unconditionally; empty for the shipped default. */
            missing_core: string[];
            /** @description Warnings about the profile, e.g. missing core denials; empty when none. */
            warnings: string[];
        };
        SetTemplateRequest: {
            /** @description Image the template creates sandboxes from; it must be in the store. */
            image: string;
            /**
             * @description Backend of its sandboxes; default container.
             * @default container
             */
            backend?: components["schemas"]["Backend"];
        };
        SignalRequest: {
            /** @description Name (SIGTERM, TERM) or number. */
            signal: string | number;
        };
        Snapshot: {
            /** @description Snapshot id: `snap-` and 16 lowercase hex characters. */
            id: string;
            /** @description The tenant it belongs to (docs/SECURITY.md "Tenancy"): `system` for what the Unix socket made. */
            tenant: string;
            /** @description Unique within its tenant: two tenants may each have a snapshot of the same name. */
            name: string | null;
            /**
             * @description What was captured: `filesystem` (a container: the writable layer, unstripped), `vm` (a microVM: the whole machine, its RAM, CPU and device state and its writable disk; a restore resumes its processes).
             * @enum {string}
             */
            kind: "filesystem" | "vm";
            /** @description The source sandbox (it may have been destroyed since). */
            sandbox_id: string;
            backend: components["schemas"]["Backend"];
            /** @description Image of the source sandbox, `name:tag`. */
            image: string;
            /** @description Layer digests a restored sandbox mounts (filesystem: the last is the snapshot layer) or attaches as disks (vm), lowest first. */
            image_layers: string[];
            /** @description filesystem: digest of the snapshot layer (the source writable layer, packed); vm: `sha256:` of the machine state file. */
            layer: string;
            /** @description Host bytes the snapshot takes: the layer blob (filesystem); the state file plus the allocated blocks of the disk copy (vm). */
            size_bytes: number;
            /** @description CPU limit of the source, cores; the default for restores. */
            cpus: number;
            /** @description Memory limit of the source, bytes; the default for restores. */
            memory_bytes: number;
            pids: number;
            /** @enum {string} */
            priority: "latency" | "batch";
            /** @description Labels of the source; the default labels of restores. */
            labels: {
                [key: string]: string;
            };
            /** @description Sandbox env of the source, kept by restores. */
            env: {
                [key: string]: string;
            };
            /** @description ms since the Unix epoch. */
            created_at: number;
            /** @description The captured machine of a `vm` snapshot, else null. */
            machine: {
                /** @description QEMU that wrote the state; a restore needs the same major.minor. */
                qemu_version: string;
                /** @enum {string} */
                accel: "kvm" | "tcg";
                /** @description Guest RAM, MiB; restores keep it (memory_bytes cannot change). */
                memory_mib: number;
                /** @description vCPUs; restores keep it (cpus must round up to it). */
                vcpus: number;
                /** @description Bytes of the migration stream (RAM pages the guest touched, CPU and device state). */
                state_bytes: number;
                /** @description sha256 (hex) of the stream, checked before every restore. */
                state_sha256: string;
                /** @description Apparent size of the writable disk copy, bytes. */
                disk_bytes: number;
                /** @description Host bytes of the disk copy (0 for a reflink). */
                disk_allocated_bytes: number;
                /** @description Whether the disk copy is a reflink of the source disk (btrfs, XFS) rather than a sparse copy. */
                disk_reflinked: boolean;
                /** @description How long the source's vCPUs were stopped for the capture, ms. */
                paused_ms: number;
            } | null;
        };
        SnapshotList: {
            snapshots: components["schemas"]["Snapshot"][];
        };
        SnapshotName: string;
        SnapshotRequest: {
            /** @description Name to restore by, unique within the tenant; default none (use the id). */
            name?: components["schemas"]["SnapshotName"];
            /** @description Containers: also checkpoint memory and processes (CRIU); answered Unimplemented, with the reason, where `criu check` fails on the host. microvm sandboxes: ignored, their snapshot always captures the whole machine (kind `vm`: RAM, processes, devices and the writable disk). */
            process?: boolean;
        };
        StartExecRequest: {
            argv: string[];
            env?: {
                [key: string]: components["schemas"]["envValue"];
            };
            /** Format: starts_with */
            cwd?: string;
            user?: string;
            /** @description Open stdin for streaming (POST .../stdin or the attach WebSocket); default /dev/null. */
            stdin?: boolean;
            /** @description Run under a pseudo-terminal of this size; stdout and stderr are then one stream (stdout). */
            tty?: {
                rows: number;
                cols: number;
            };
            timeout_ms?: number;
            /** @description Pace the command by its readers instead of spooling its output (what `dsec exec` uses, as `docker exec` streams): output is held in dsecd until an attached reader (attach WebSocket, output?follow) has taken it, at most 1 MiB per stream, and the command blocks on its full pipes while its readers are further behind (or none is attached yet). No size limit and no spool file; output a reader has taken is gone, so a later reader starts at the oldest byte still held. Default false: spooled to disk up to 1 GiB per stream, readable again from any offset. */
            paced?: boolean;
        };
        StatsResponse: {
            /** @description ms since the Unix epoch, when sampled. */
            time: number;
            host: {
                cores: number;
                memory_bytes: number;
                memory_available_bytes: number;
                load_avg: number[];
            };
            sandboxes: components["schemas"]["SandboxStatsView"][];
        };
        /** @enum {string} */
        StepState: "running" | "finished" | "unknown";
        StopRequest: {
            /** @description Grace between SIGTERM and SIGKILL, ms; default 10000, 0 kills at once. */
            timeout_ms?: number;
        };
        TagRequest: {
            /** @description Image reference, name[:tag]. */
            target: string;
        };
        Template: {
            /** @description Template name E2B clients pass as templateID. */
            name: string;
            /** @description dsec image ref the sandbox is created from. */
            image: string;
            /** @description Backend (isolation tier) of its sandboxes. */
            backend: components["schemas"]["Backend"];
            /** @description True for the built-in default (base -> e2b-base, container) that no alias overrides. */
            builtin: boolean;
        };
        TemplateList: {
            templates: components["schemas"]["Template"][];
        };
        TokenView: {
            /** @description 16 hex: the first part of the token text after e2b_. */
            id: string;
            tenant: string;
            /** @enum {string} */
            role: "admin" | "user" | "reader" | "metrics";
            description: string | null;
            created_at: number;
            expires_at: number | null;
            revoked_at: number | null;
            /** @enum {string} */
            state: "active" | "expired" | "revoked";
        };
        TrajectoryDetail: {
            /** @description The trajectory's id, unique within its tenant. */
            id: string;
            /** @description The tenant it belongs to: the tenant of the sandboxes its steps ran in. */
            tenant: string;
            /** @description Host name of the dsecd that holds the log. */
            host: string;
            /** @description Recorded steps. */
            steps: number;
            first_step: number | null;
            last_step: number | null;
            /** @description Steps whose outcome is unknown. */
            unknown: number;
            /** @description Sandbox of the latest step. */
            sandbox_id: string | null;
            /** @description How many times the log was truncated. */
            truncations: number;
            created_at: number;
            updated_at: number;
            step_list: components["schemas"]["TrajectoryStep"][];
        };
        TrajectoryId: string;
        TrajectoryList: {
            trajectories: components["schemas"]["TrajectorySummary"][];
        };
        TrajectoryRecord: {
            step: number;
            state: components["schemas"]["StepState"];
            /** @description sha256 (hex) of the canonical request: argv, env, cwd, user, stdin digest, timeout_ms. */
            hash: string;
            /** @description Sandbox the step ran in. */
            sandbox_id: string;
            argv: string[];
            /** @description ms since the Unix epoch. */
            started_at: number;
            finished_at: number | null;
            exit_code: number | null;
            signal: string | null;
            oom: boolean | null;
            timed_out: boolean | null;
            duration_ms: number | null;
            stdout_bytes: number | null;
            stderr_bytes: number | null;
            /** @description How many times the recorded result was replayed. */
            replays: number;
            /** @description Why the outcome is unknown, when it is. */
            error: string | null;
            trajectory: string;
            host: string;
            env: {
                [key: string]: string;
            };
            cwd: string | null;
            user: string | null;
            timeout_ms: number | null;
            stdin_sha256: string | null;
            stdout_b64: string | null;
            stderr_b64: string | null;
            stdout_truncated: boolean | null;
            stderr_truncated: boolean | null;
        };
        TrajectoryRemoved: {
            id: string;
            removed_steps: number;
        };
        TrajectoryStep: {
            step: number;
            state: components["schemas"]["StepState"];
            /** @description sha256 (hex) of the canonical request: argv, env, cwd, user, stdin digest, timeout_ms. */
            hash: string;
            /** @description Sandbox the step ran in. */
            sandbox_id: string;
            argv: string[];
            /** @description ms since the Unix epoch. */
            started_at: number;
            finished_at: number | null;
            exit_code: number | null;
            signal: string | null;
            oom: boolean | null;
            timed_out: boolean | null;
            duration_ms: number | null;
            stdout_bytes: number | null;
            stderr_bytes: number | null;
            /** @description How many times the recorded result was replayed. */
            replays: number;
            /** @description Why the outcome is unknown, when it is. */
            error: string | null;
        };
        TrajectorySummary: {
            /** @description The trajectory's id, unique within its tenant. */
            id: string;
            /** @description The tenant it belongs to: the tenant of the sandboxes its steps ran in. */
            tenant: string;
            /** @description Host name of the dsecd that holds the log. */
            host: string;
            /** @description Recorded steps. */
            steps: number;
            first_step: number | null;
            last_step: number | null;
            /** @description Steps whose outcome is unknown. */
            unknown: number;
            /** @description Sandbox of the latest step. */
            sandbox_id: string | null;
            /** @description How many times the log was truncated. */
            truncations: number;
            created_at: number;
            updated_at: number;
        };
        VersionInfo: {
            /** @description dsec version. */
            version: string;
            /** @constant */
            api: "v1";
            /** @description Version of the in-sandbox agent protocol. */
            agent_protocol: number;
            node: string;
        };
        Whoami: {
            /** @enum {string} */
            door: "unix" | "tcp";
            /** @description The token that authenticated the request; null on the Unix socket. */
            token_id: string | null;
            tenant: string;
            /** @enum {string} */
            role: "admin" | "user" | "reader" | "metrics";
            /** @description The verified client certificate (mutual TLS), else null. */
            peer: {
                name: string;
                role: string | null;
                fingerprint256: string;
            } | null;
        };
        envKey: string;
        envValue: string;
        labelKey: string;
        labelValue: string;
    };
    responses: never;
    parameters: never;
    requestBodies: never;
    headers: never;
    pathItems: never;
}
export type $defs = Record<string, never>;
export type operations = Record<string, never>;
