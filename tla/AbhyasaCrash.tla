---------------------------- MODULE AbhyasaCrash ----------------------------
(***************************************************************************)
(* Abhyasa custody machine with custodian and receiver crash/restart at    *)
(* any step, on top of the adversarial channel of Abhyasa.tla.  The        *)
(* protocol actions are the same as in Abhyasa.tla (duplicated here, not   *)
(* EXTENDed, because every custodian variable is split into a volatile and *)
(* a durable image).                                                       *)
(*                                                                         *)
(* Custodian (+ principal state, same node, same store):                   *)
(*   cv  volatile image: what the running state machine believes.          *)
(*   cd  durable image: what Store::commit has made durable.               *)
(*   Every custodian transition changes cv only and stages its transmits   *)
(*   in `outbox`.  Commit (Store::commit, group commit: any number of      *)
(*   transitions per commit) makes cd := cv durable and only THEN releases *)
(*   the outbox to the channel.  Hence the obligation is durable before    *)
(*   its first send (AB-1) and the attempt count is durable before each    *)
(*   send (AB-2).  A crash loses cv and the outbox; Custodian::restore     *)
(*   rebuilds cv from cd: the pending set, the ABSOLUTE deadline (never    *)
(*   restarted) and the attempts already spent (remaining budget).         *)
(*   Principal-side effects (safe(O), decisions) count only once durable:  *)
(*   an uncommitted apply_safe is redone after recovery.                   *)
(*                                                                         *)
(* Receiver: its ledger (applied / declined with reason) and the newest    *)
(* sequence per key are durable and committed atomically WITH the effect,  *)
(* in the same step; the ack is emitted after that commit.  A crash        *)
(* between the commit and the ack is indistinguishable from the channel    *)
(* dropping the ack, which Drop already covers.  The receiver's deferred   *)
(* set is volatile and lost on a crash (the custodian's retries bring the  *)
(* obligation back).                                                       *)
(*                                                                         *)
(* Crashes of either side are bounded in total by MaxCrashes.  Time keeps  *)
(* running while a node is down.                                           *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, Sequences, TLC

CONSTANTS
    O1, O2,         \* admissible obligations on governed key "k", sequences 1, 2
    B1,             \* benign obligation: best-effort only, never under custody
    MaxRetries,     \* retransmissions after the first attempt (AB-2)
    Deadline,       \* custody window in ticks; deadline = offer time + Deadline
    MaxTime,        \* bound on the global clock
    SkewMargin,     \* receiver applies only while now + SkewMargin < deadline
    SurfacePolicy,  \* admissible obligations whose kind surfaces declines
    MayRefuse,      \* BOOLEAN: receiver's applier may accountably refuse
    MayDefer,       \* admissible obligations the receiver's applier may defer
    MaxCrashes      \* bound on crashes (custodian + receiver together)

Adm     == {O1, O2}
Benign  == {B1}
Obl     == Adm \cup Benign
Keys    == {"k", "kb"}
KeyOf(o) == IF o = B1 THEN "kb" ELSE "k"
SeqOf(o) == IF o = O2 THEN 2 ELSE 1
MaxSeq  == 2
MaxAttempts == 1 + MaxRetries
MaxDl   == MaxTime + Deadline

ASSUME /\ O1 # O2 /\ O1 # B1 /\ O2 # B1
       /\ MaxRetries \in Nat
       /\ Deadline \in Nat /\ Deadline > 0
       /\ MaxTime \in Nat
       /\ SkewMargin \in Nat
       /\ SurfacePolicy \subseteq Adm
       /\ MayRefuse \in BOOLEAN
       /\ MayDefer \subseteq Adm
       /\ MaxCrashes \in Nat

CStates    == {"idle", "pending", "applied", "declined", "escalated"}
Discharged == {"applied", "declined", "escalated"}
Reasons    == {"none", "refused", "expired", "superseded"}
Statuses   == {"none", "applied", "deferred", "declined"}
Causes     == {"none", "unreachable", "deferring"}
Decisions  == {"none", "safe", "accept"}

ObMsg(o, d)     == [type |-> "obl", o |-> o, dl |-> d, status |-> "none", reason |-> "none"]
AckMsg(o, s, r) == [type |-> "ack", o |-> o, dl |-> 0, status |-> s, reason |-> r]
Msgs == [type : {"obl", "ack"}, o : Obl, dl : 0..MaxDl, status : Statuses, reason : Reasons]

\* Shape of the custodian + principal image (volatile cv and durable cd).
\* The custody store holds admissible obligations only; `st` is defined on
\* every obligation so that "benign never in custody" is a checked fact.
CRec == [st     : [Obl -> CStates],          \* custody state
         att    : [Obl -> 0..MaxAttempts],   \* attempts (durable before each send)
         dl     : [Obl -> 0..MaxDl],         \* absolute deadline (0 = none)
         dfr    : [Adm -> BOOLEAN],          \* a `deferred` ack was seen
         cause  : [Adm -> Causes],           \* escalation cause
         reason : [Adm -> Reasons],          \* decline reason
         late   : [Adm -> BOOLEAN],          \* late `applied` recorded
         pnew   : [Keys -> 0..MaxSeq],       \* principal: newest sequence per key
         psafe  : [Adm -> BOOLEAN],          \* principal: safe(O) took effect
         pdrop  : [Adm -> BOOLEAN],          \* principal: safe(O) dropped by guard
         await  : [Adm -> BOOLEAN],          \* principal: surfaced decline pending
         dec    : [Adm -> Decisions]]        \* principal: decision on it

CInit == [st     |-> [o \in Obl |-> "idle"],
          att    |-> [o \in Obl |-> 0],
          dl     |-> [o \in Obl |-> 0],
          dfr    |-> [o \in Adm |-> FALSE],
          cause  |-> [o \in Adm |-> "none"],
          reason |-> [o \in Adm |-> "none"],
          late   |-> [o \in Adm |-> FALSE],
          pnew   |-> [k \in Keys |-> 0],
          psafe  |-> [o \in Adm |-> FALSE],
          pdrop  |-> [o \in Adm |-> FALSE],
          await  |-> [o \in Adm |-> FALSE],
          dec    |-> [o \in Adm |-> "none"]]

VARIABLES
    now,        \* global discrete clock
    crashes,    \* crashes so far (both sides)
    cUp,        \* custodian node running
    cv,         \* custodian + principal volatile image (CRec)
    cd,         \* custodian + principal durable image (CRec)
    outbox,     \* transmits staged, released only by Commit (volatile)
    bst,        \* benign -> "idle" | "best_effort" (caller's view; no custody)
    bdl,        \* benign -> deadline carried by its single best-effort send
    rUp,        \* receiver node running
    rst,        \* obligation -> receiver ledger: none | applied | declined (durable)
    rreason,    \* obligation -> recorded decline reason (durable)
    rNewest,    \* key -> newest sequence applied at the receiver (durable)
    rdef,       \* set of [o, dl] the receiver has deferred (volatile)
    msgs,       \* channel: set of in-flight messages
    sends,      \* ghost: obligation -> transmissions released to the channel
    applyCount, \* ghost: obligation -> times the effect was executed
    lateApply   \* ghost: applications at/after the deadline (must stay 0)

vars == <<now, crashes, cUp, cv, cd, outbox, bst, bdl,
          rUp, rst, rreason, rNewest, rdef, msgs, sends, applyCount, lateApply>>

TypeOK ==
    /\ now        \in 0..MaxTime
    /\ crashes    \in 0..MaxCrashes
    /\ cUp        \in BOOLEAN
    /\ cv         \in CRec
    /\ cd         \in CRec
    /\ outbox     \subseteq Msgs
    /\ bst        \in [Benign -> {"idle", "best_effort"}]
    /\ bdl        \in [Benign -> 0..MaxDl]
    /\ rUp        \in BOOLEAN
    /\ rst        \in [Obl -> {"none", "applied", "declined"}]
    /\ rreason    \in [Obl -> Reasons]
    /\ rNewest    \in [Keys -> 0..MaxSeq]
    /\ rdef       \subseteq [o : Obl, dl : 0..MaxDl]
    /\ msgs       \subseteq Msgs
    /\ sends      \in [Obl -> Nat]
    /\ applyCount \in [Obl -> Nat]
    /\ lateApply  \in Nat

Init ==
    /\ now        = 0
    /\ crashes    = 0
    /\ cUp        = TRUE
    /\ cv         = CInit
    /\ cd         = CInit
    /\ outbox     = {}
    /\ bst        = [b \in Benign |-> "idle"]
    /\ bdl        = [b \in Benign |-> 0]
    /\ rUp        = TRUE
    /\ rst        = [o \in Obl |-> "none"]
    /\ rreason    = [o \in Obl |-> "none"]
    /\ rNewest    = [k \in Keys |-> 0]
    /\ rdef       = {}
    /\ msgs       = {}
    /\ sends      = [o \in Obl |-> 0]
    /\ applyCount = [o \in Obl |-> 0]
    /\ lateApply  = 0

custVars == <<cv, cd, outbox, bst, bdl>>
recvVars == <<rst, rreason, rNewest, rdef, applyCount, lateApply>>

-----------------------------------------------------------------------------
(* Principal side (pure functions on a custodian image)                    *)
-----------------------------------------------------------------------------

\* PrincipalState::apply_safe, guarded by sequence; a drop is recorded.
WithSafe(c, o) ==
    IF SeqOf(o) > c.pnew[KeyOf(o)]
    THEN [c EXCEPT !.pnew[KeyOf(o)] = SeqOf(o), !.psafe[o] = TRUE]
    ELSE [c EXCEPT !.pdrop[o] = TRUE]

\* An in-time `applied` ack: O's sequence becomes the newest in force on its
\* key principal-side (max, never lowering).
WithConfirmed(c, o) ==
    [c EXCEPT !.pnew[KeyOf(o)] = IF SeqOf(o) > @ THEN SeqOf(o) ELSE @]

-----------------------------------------------------------------------------
(* Custodian (all transitions: volatile image + outbox only)               *)
-----------------------------------------------------------------------------

\* Group commit lets the runtime batch many transitions into one commit.
\* Batching is not modelled: a custodian transition starts only from a
\* committed image (Clean), so at most one transition is staged when a crash
\* hits.  This loses no durable or externally visible behaviour: staged
\* transitions have no effect outside the volatile image until they are
\* committed, so losing k staged transitions in a crash looks exactly like
\* those k transitions never having run, and committing k at once looks
\* like k single commits whose transmits the channel delayed.
Clean == cv = cd /\ outbox = {}

\* Custodian::offer -- custody taken (write-ahead: staged, sent on Commit).
\* If the node crashes before the commit, the offer never happened and may
\* be made again: Custodian::offer itself returns at once, but it only
\* queues the record and the transmit, and the node answers its caller
\* only after the commit.
Offer(o) ==
    /\ cUp
    /\ Clean
    /\ o \in Adm
    /\ cv.st[o] = "idle"
    /\ o = O2 => cv.st[O1] # "idle"
    /\ cv'     = [cv EXCEPT !.st[o] = "pending", !.att[o] = 1,
                            !.dl[o] = now + Deadline]
    /\ outbox' = outbox \cup {ObMsg(o, now + Deadline)}
    /\ UNCHANGED <<now, crashes, cUp, cd, bst, bdl, rUp, recvVars, msgs, sends>>

\* Custodian::offer on an inadmissible obligation (AC-1): one attempt, no
\* custody record, nothing to commit, no fail-safe, no escalation.
SendBestEffort(b) ==
    /\ cUp
    /\ b \in Benign
    /\ bst[b] = "idle"
    /\ bst'   = [bst EXCEPT ![b] = "best_effort"]
    /\ bdl'   = [bdl EXCEPT ![b] = now + Deadline]
    /\ msgs'  = msgs \cup {ObMsg(b, now + Deadline)}
    /\ sends' = [sends EXCEPT ![b] = @ + 1]
    /\ UNCHANGED <<now, crashes, cUp, cv, cd, outbox, rUp, recvVars, applyCount>>

\* Custodian::handle_timeout -- escalate (with safe(O), one staged record)
\* at the deadline or on retry exhaustion; otherwise stage a retransmission
\* whose attempt count becomes durable before it is released.
HandleTimeout(o) ==
    /\ cUp
    /\ Clean
    /\ o \in Adm
    /\ cv.st[o] = "pending"
    /\ IF now >= cv.dl[o] \/ cv.att[o] >= MaxAttempts
       THEN /\ cv' = WithSafe([cv EXCEPT !.st[o] = "escalated",
                                         !.cause[o] = IF cv.dfr[o] THEN "deferring"
                                                                   ELSE "unreachable"], o)
            /\ UNCHANGED outbox
       ELSE /\ cv'     = [cv EXCEPT !.att[o] = @ + 1]
            /\ outbox' = outbox \cup {ObMsg(o, cv.dl[o])}
    /\ UNCHANGED <<now, crashes, cUp, cd, bst, bdl, rUp, recvVars, msgs, sends>>

\* Custodian::handle_ack -- the four cases of Abhyasa.tla, on the volatile
\* image.  Anything else is counted and ignored (no step).
AckNext(c, m) ==
    LET o == m.o IN
    CASE m.status = "applied" /\ c.st[o] = "pending" ->
             WithConfirmed([c EXCEPT !.st[o] = "applied"], o)
      [] m.status = "applied" /\ c.st[o] = "escalated" /\ ~c.late[o] ->
             [c EXCEPT !.late[o] = TRUE]
      [] m.status = "declined" /\ c.st[o] = "pending" /\ o \in SurfacePolicy ->
             [c EXCEPT !.st[o] = "declined", !.reason[o] = m.reason, !.await[o] = TRUE]
      [] m.status = "declined" /\ c.st[o] = "pending" /\ o \notin SurfacePolicy ->
             WithSafe([c EXCEPT !.st[o] = "declined", !.reason[o] = m.reason], o)
      [] m.status = "deferred" /\ c.st[o] = "pending" ->
             [c EXCEPT !.dfr[o] = TRUE]
      [] OTHER -> c

HandleAck(m) ==
    /\ cUp
    /\ Clean
    /\ m \in msgs
    /\ m.type = "ack"
    /\ m.o \in Adm
    /\ AckNext(cv, m) # cv
    /\ cv' = AckNext(cv, m)
    /\ UNCHANGED <<now, crashes, cUp, cd, outbox, bst, bdl, rUp, recvVars, msgs, sends>>

\* PrincipalState::decide on a surfaced decline (guarded when it applies
\* the fail-safe); committed like every other principal-side change.
Decide(o, choice) ==
    /\ cUp
    /\ Clean
    /\ o \in Adm
    /\ cv.await[o]
    /\ cv' = LET c == [cv EXCEPT !.await[o] = FALSE, !.dec[o] = choice]
             IN IF choice = "safe" THEN WithSafe(c, o) ELSE c
    /\ UNCHANGED <<now, crashes, cUp, cd, outbox, bst, bdl, rUp, recvVars, msgs, sends>>

\* Store::commit -- commit of what is staged, then release of the transmits
\* that depended on it.  `sends` counts released transmissions.
Commit ==
    /\ cUp
    /\ cv # cd \/ outbox # {}
    /\ cd'     = cv
    /\ msgs'   = msgs \cup outbox
    /\ sends'  = [o \in Obl |-> IF \E m \in outbox : m.o = o THEN sends[o] + 1
                                                             ELSE sends[o]]
    /\ outbox' = {}
    /\ UNCHANGED <<now, crashes, cUp, cv, bst, bdl, rUp, recvVars, applyCount>>

\* Crash: the volatile image and the staged transmits are lost.  (cv is
\* reset to the durable image right away; it is unused while down.)
CrashCustodian ==
    /\ cUp
    /\ crashes < MaxCrashes
    /\ crashes' = crashes + 1
    /\ cUp'     = FALSE
    /\ cv'      = cd
    /\ outbox'  = {}
    /\ UNCHANGED <<now, cd, bst, bdl, rUp, recvVars, msgs, sends>>

\* Custodian::restore -- rebuild from the store: pending set, absolute
\* deadlines and spent attempts come from cd; nothing is restarted.
RestoreCustodian ==
    /\ ~cUp
    /\ cUp' = TRUE
    /\ cv'  = cd
    /\ UNCHANGED <<now, crashes, cd, outbox, bst, bdl, rUp, recvVars, msgs, sends>>

-----------------------------------------------------------------------------
(* Receiver                                                                *)
-----------------------------------------------------------------------------

AckOut(o, s, r) == IF o \in Benign THEN {} ELSE {AckMsg(o, s, r)}

\* Effect, ledger entry and newest-on-key in one atomic commit, then the ack.
RApply(o, d) ==
    /\ rst'        = [rst EXCEPT ![o] = "applied"]
    /\ rNewest'    = [rNewest EXCEPT ![KeyOf(o)] = SeqOf(o)]
    /\ applyCount' = [applyCount EXCEPT ![o] = @ + 1]
    /\ lateApply'  = IF now + SkewMargin >= d THEN lateApply + 1 ELSE lateApply
    /\ rdef'       = {x \in rdef : x.o # o}
    /\ msgs'       = msgs \cup AckOut(o, "applied", "none")
    /\ UNCHANGED rreason

\* A decline is recorded durably in the ledger before it is acked, so a
\* redelivery after a crash gets the same answer.
RDecline(o, why) ==
    /\ rst'     = [rst EXCEPT ![o] = "declined"]
    /\ rreason' = [rreason EXCEPT ![o] = why]
    /\ rdef'    = {x \in rdef : x.o # o}
    /\ msgs'    = msgs \cup AckOut(o, "declined", why)
    /\ UNCHANGED <<rNewest, applyCount, lateApply>>

\* Deferral lives in volatile memory only.
RDefer(o, d) ==
    /\ rdef' = rdef \cup {[o |-> o, dl |-> d]}
    /\ msgs' = msgs \cup AckOut(o, "deferred", "none")
    /\ UNCHANGED <<rst, rreason, rNewest, applyCount, lateApply>>

\* Expiry, then supersession, then the applier.  Refusal and deferral are
\* given to admissible obligations only: a restriction of the model (the
\* Rust applier may decline or defer B1 too), sound for the same reason as
\* in Abhyasa.tla.
RDecide(o, d, mayDefer) ==
    IF now + SkewMargin >= d
    THEN RDecline(o, "expired")
    ELSE IF SeqOf(o) <= rNewest[KeyOf(o)]
         THEN RDecline(o, "superseded")
         ELSE \/ RApply(o, d)
              \/ (MayRefuse /\ o \in Adm /\ RDecline(o, "refused"))
              \/ (mayDefer /\ o \in MayDefer /\ RDefer(o, d))

\* Receiver::handle_obligation -- durable ledger check first.
RecvObligation(m) ==
    /\ rUp
    /\ m \in msgs
    /\ m.type = "obl"
    /\ LET o == m.o IN
         \/ /\ rst[o] = "applied"
            /\ msgs' = msgs \cup AckOut(o, "applied", "none")
            /\ UNCHANGED recvVars
         \/ /\ rst[o] = "declined"
            /\ msgs' = msgs \cup AckOut(o, "declined", rreason[o])
            /\ UNCHANGED recvVars
         \/ /\ rst[o] = "none"
            /\ RDecide(o, m.dl, TRUE)
    /\ UNCHANGED <<now, crashes, cUp, custVars, rUp, sends>>

\* Receiver::complete_deferred -- final ack pushed for a deferred obligation.
CompleteDeferred(x) ==
    /\ rUp
    /\ x \in rdef
    /\ rst[x.o] = "none"
    /\ RDecide(x.o, x.dl, FALSE)
    /\ UNCHANGED <<now, crashes, cUp, custVars, rUp, sends>>

CrashReceiver ==
    /\ rUp
    /\ crashes < MaxCrashes
    /\ crashes' = crashes + 1
    /\ rUp'     = FALSE
    /\ rdef'    = {}
    /\ UNCHANGED <<now, cUp, custVars, rst, rreason, rNewest, msgs, sends,
                   applyCount, lateApply>>

\* Receiver::restore -- ledger and newest-per-key are read back from the store.
RestoreReceiver ==
    /\ ~rUp
    /\ rUp' = TRUE
    /\ UNCHANGED <<now, crashes, cUp, custVars, recvVars, msgs, sends>>

-----------------------------------------------------------------------------
(* Environment                                                             *)
-----------------------------------------------------------------------------

Tick ==
    /\ now < MaxTime
    /\ now' = now + 1
    /\ UNCHANGED <<crashes, cUp, custVars, rUp, recvVars, msgs, sends>>

Drop(m) ==
    /\ m \in msgs
    /\ msgs' = msgs \ {m}
    /\ UNCHANGED <<now, crashes, cUp, custVars, rUp, recvVars, sends>>

Done ==
    /\ \A o \in Adm : cd.st[o] \in Discharged /\ ~cd.await[o]
    /\ UNCHANGED vars

Next ==
    \/ Tick
    \/ \E o \in Obl :
         \/ Offer(o) \/ SendBestEffort(o) \/ HandleTimeout(o)
         \/ \E c \in {"safe", "accept"} : Decide(o, c)
    \/ \E x \in rdef : CompleteDeferred(x)
    \/ \E m \in msgs : HandleAck(m) \/ RecvObligation(m) \/ Drop(m)
    \/ Commit \/ CrashCustodian \/ RestoreCustodian
    \/ CrashReceiver \/ RestoreReceiver
    \/ Done

\* Weak fairness on the custodian node's own actions, including its group
\* commit and its restart.  Nothing is assumed of the channel, the receiver
\* or the clock; crashes are finite because they are bounded.
Fairness ==
    /\ \A o \in Adm : WF_vars(Offer(o))
    /\ \A o \in Adm : WF_vars(HandleTimeout(o))
    /\ WF_vars(\E m \in msgs : HandleAck(m))
    /\ \A o \in Adm : WF_vars(\E c \in {"safe", "accept"} : Decide(o, c))
    /\ WF_vars(Commit)
    /\ WF_vars(RestoreCustodian)

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(* State-space reduction (TLC VIEW), as in Abhyasa.tla                     *)
-----------------------------------------------------------------------------

\* Inertness is judged on the DURABLE image: a crash rolls cv back to cd, so
\* an ack the volatile image would ignore may matter again after recovery.
\* Everything in cd only moves forward, so an ack inert for cd stays inert.
AckInert(o, s) ==
    CASE s = "deferred" -> cd.st[o] # "pending" \/ cd.dfr[o]
      [] s = "declined" -> cd.st[o] # "pending"
      [] s = "applied"  -> cd.st[o] # "pending" /\ (cd.st[o] = "escalated" => cd.late[o])
      [] OTHER          -> TRUE

Inert(m) ==
    IF m.type = "ack"
    THEN AckInert(m.o, m.status)
    ELSE /\ rst[m.o] \in {"applied", "declined"}
         /\ (m.o \in Adm => AckInert(m.o, rst[m.o]))

LiveMsgs == {m \in msgs : ~Inert(m)}
View == <<now, crashes, cUp, custVars, rUp, recvVars, LiveMsgs, sends>>

-----------------------------------------------------------------------------
(* Safety invariants                                                       *)
-----------------------------------------------------------------------------

\* AB-2 across crashes: total transmissions bounded, and every released
\* transmission's attempt count was durable first.
BoundedRetries ==
    \A o \in Adm : sends[o] <= MaxAttempts /\ cv.att[o] <= MaxAttempts
WriteAheadAttempts ==
    \A o \in Adm : sends[o] <= cd.att[o]

\* AB-1: an obligation is on the wire only once it is durably under custody.
DurableBeforeSend ==
    \A m \in msgs : (m.type = "obl" /\ m.o \in Adm) => cd.st[m.o] # "idle"

\* AB-3: at most once, ledger and effect agree (they were one commit).
EffectivelyOnce == \A o \in Obl : applyCount[o] <= 1
LedgerMatchesEffect == \A o \in Obl : (rst[o] = "applied") <=> (applyCount[o] = 1)

\* AB-4 on the durable record (and on the volatile one while running).
FailSafeOf(c) ==
    \A o \in Adm : c.st[o] = "escalated" => (c.psafe[o] \/ c.pdrop[o])
EscalationFailSafe == FailSafeOf(cd) /\ (cUp => FailSafeOf(cv))

DeclineOK(c) ==
    \A o \in Adm : c.st[o] = "declined" =>
        IF o \in SurfacePolicy THEN c.await[o] \/ c.dec[o] # "none"
                               ELSE c.psafe[o] \/ c.pdrop[o]
DeclineNeverIgnored == DeclineOK(cd) /\ DeclineOK(cv)

DeliverOrReport ==
    \A o \in Adm : cd.st[o] \in {"idle", "pending"} \cup Discharged

BenignNeverInCustody ==
    /\ \A b \in Benign : cd.st[b] = "idle" /\ cv.st[b] = "idle"
    /\ \A b \in Benign : sends[b] <= 1
    /\ \A m \in outbox : m.o \in Adm

NoApplicationAfterDeadline == lateApply = 0

\* Recovery resumes the same absolute deadline and never loses spent
\* attempts: the volatile image agrees with the durable one on both.
RecoveryResumesWindow ==
    \A o \in Adm : cd.st[o] # "idle" =>
        /\ cv.dl[o] = cd.dl[o]
        /\ cv.att[o] >= cd.att[o]

CustodianTruthful ==
    \A o \in Adm :
        /\ cd.st[o] = "applied"  => rst[o] = "applied"
        /\ cd.st[o] = "declined" => rst[o] = "declined" /\ cd.reason[o] = rreason[o]
        /\ cd.late[o] => cd.st[o] = "escalated" /\ rst[o] = "applied"

SupersessionConsistent ==
    /\ \A o \in Adm : (cd.psafe[o] \/ cd.pdrop[o]) => cd.pnew[KeyOf(o)] >= SeqOf(o)
    /\ \A o \in Obl : rst[o] = "applied" => rNewest[KeyOf(o)] >= SeqOf(o)
    /\ \A o \in Obl : (rst[o] = "declined" /\ rreason[o] = "superseded")
                         => rNewest[KeyOf(o)] >= SeqOf(o)

-----------------------------------------------------------------------------
(* Action properties                                                       *)
-----------------------------------------------------------------------------

\* Supersession never regresses: the durable principal state (what the
\* principal can observe) and the receiver's durable newest-per-key.
PrincipalNewestMonotone == [][\A k \in Keys : cd'.pnew[k] >= cd.pnew[k]]_vars
ReceiverNewestMonotone  == [][\A k \in Keys : rNewest'[k] >= rNewest[k]]_vars

\* Once durable, a deadline never moves (not extended by deferral, not
\* restarted by recovery), and durable attempts never go down.
DeadlineNeverMoves ==
    [][\A o \in Adm : cd.st[o] # "idle" => cd'.dl[o] = cd.dl[o]]_vars
AttemptsNeverReset ==
    [][\A o \in Adm : cd'.att[o] >= cd.att[o]]_vars

\* A durable terminal record is never reopened.
TerminalStable ==
    [][\A o \in Adm : cd.st[o] \in Discharged => cd'.st[o] = cd.st[o]]_vars

-----------------------------------------------------------------------------
(* Liveness                                                                *)
-----------------------------------------------------------------------------

\* Every admissible obligation durably terminates applied / declined /
\* escalated, despite up to MaxCrashes crashes anywhere.
DeliverOrReportLive == \A o \in Adm : <>(cd.st[o] \in Discharged)

SurfacedEventuallyDecided == \A o \in Adm : cd.await[o] ~> ~cd.await[o]

=============================================================================
