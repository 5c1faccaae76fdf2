/**
 * Messages between dsecd and its resolver process (daemon/net/resolver-child.ts), over
 * the Node IPC channel the child inherits. The child does the DNS wire work in the
 * instance netns; dsecd makes every decision and owns the egress maps.
 *
 *   child -> dsecd  `query`   a question from a sandbox: what to do with it?
 *   dsecd -> child  `verdict` refuse it, or forward it (and whether to report the answer)
 *   child -> dsecd  `answer`  the upstream's addresses for a forwarded allow-mode question
 *   dsecd -> child  `pinned`  the addresses are in the sandbox's egress maps: send the answer
 *   child -> dsecd  `ready` / `error`   bound (or could not bind) the gateway address
 */

/** A question from a sandbox (identified by its source address on the bridge). */
export interface QueryMsg { t: 'query'; n: number; src: string; name: string; type: number }
/** dsecd's decision for question `n`. `report`: send the answer's addresses back before answering. */
export interface VerdictMsg { t: 'verdict'; n: number; action: 'refuse' | 'forward'; report: boolean }
/** Addresses (and TTLs, seconds) of the upstream's answer to question `n`. */
export interface AnswerMsg { t: 'answer'; n: number; addresses: { family: 4 | 6; address: string; ttl: number }[] }
/** The answer to question `n` may go out (its addresses are allowed now). */
export interface PinnedMsg { t: 'pinned'; n: number }
/** The child is serving on the gateway address. */
export interface ReadyMsg { t: 'ready'; pid: number }
/** The child could not start serving. */
export interface ErrorMsg { t: 'error'; message: string }

export type ChildToParent = QueryMsg | AnswerMsg | ReadyMsg | ErrorMsg;
export type ParentToChild = VerdictMsg | PinnedMsg;
