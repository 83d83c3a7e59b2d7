------------------------------ MODULE Abhyasa ------------------------------
(***************************************************************************)
(* Abhyasa custody machine over an adversarial channel (no crashes; see    *)
(* AbhyasaCrash.tla for custodian/receiver crash and recovery).            *)
(*                                                                         *)
(* Normative source: shared DESIGN.md section 2.  Scope of this model:     *)
(*   - AC-1  one benign (inadmissible) obligation B1 travels best-effort   *)
(*           and is never under custody; O1, O2 are admissible.            *)
(*   - AB-1/AB-2  custody from offer until applied/declined ack, absolute  *)
(*           deadline or retry exhaustion; bounded retransmission.         *)
(*   - AB-3  receiver ledger keyed on obligation id; redelivery re-acks.   *)
(*   - AB-4  fail-safe safe(O) applied principal-side on escalation.       *)
(*   - decline: default policy applies safe(O); "surface" policy records   *)
(*           an awaiting-decision item that the principal decides.         *)
(*   - deferred ack: extends neither the deadline nor the retry budget;    *)
(*           only changes the escalation cause.  Receiver may later push   *)
(*           the final ack (CompleteDeferred).                             *)
(*   - deadlines bind both sides: the receiver never applies at/after the  *)
(*           deadline (minus a skew margin) and declines "expired"; an     *)
(*           applied ack after escalation is recorded (late), never        *)
(*           reopening the terminal state.                                 *)
(*   - two-sided supersession guard over O1 (sequence 1) and O2            *)
(*           (sequence 2) on one governed key.                             *)
(*                                                                         *)
(* Channel: a SET of in-flight messages.  Delivery does not remove the     *)
(* message (the network may hold further copies: duplication), any member  *)
(* may be delivered next (reordering), and Drop removes a member (loss).   *)
(* This admits every loss/duplication/reordering pattern of a bag with     *)
(* unbounded multiplicities while keeping the state space finite.          *)
(*                                                                         *)
(* Time: one discrete global clock `now`, advanced by Tick up to MaxTime.  *)
(* Deadlines are absolute (offer time + Deadline).  The backoff schedule   *)
(* is abstracted: a retransmission may happen at any point before the      *)
(* deadline, which over-approximates every capped, jittered schedule.      *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets, Sequences, TLC

CONSTANTS
    O1, O2,         \* admissible obligations on governed key "k", sequences 1, 2
    B1,             \* benign obligation (e.g. a consent grant): best-effort only
    MaxRetries,     \* retransmissions after the first attempt (AB-2)
    Deadline,       \* custody window in ticks; deadline = offer time + Deadline
    MaxTime,        \* bound on the global clock (model-checking bound)
    SkewMargin,     \* receiver applies only while now + SkewMargin < deadline
    SurfacePolicy,  \* admissible obligations whose kind surfaces declines
    MayRefuse,      \* BOOLEAN: the receiver's applier may accountably refuse
    MayDefer        \* admissible obligations the receiver's applier may defer

Adm     == {O1, O2}
Benign  == {B1}
Obl     == Adm \cup Benign
Keys    == {"k", "kb"}
KeyOf(o) == IF o = B1 THEN "kb" ELSE "k"
SeqOf(o)   == IF o = O2 THEN 2 ELSE 1
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

CStates    == {"idle", "pending", "applied", "declined", "escalated", "best_effort"}
Discharged == {"applied", "declined", "escalated"}
Reasons    == {"none", "refused", "expired", "superseded"}
Statuses   == {"none", "applied", "deferred", "declined"}

\* Every message has the same fields so that messages compare uniformly.
ObMsg(o, d)     == [type |-> "obl", o |-> o, dl |-> d, status |-> "none", reason |-> "none"]
AckMsg(o, s, r) == [type |-> "ack", o |-> o, dl |-> 0, status |-> s, reason |-> r]
Msgs == [type : {"obl", "ack"}, o : Obl, dl : 0..MaxDl, status : Statuses, reason : Reasons]

VARIABLES
    now,        \* global discrete clock
    \* ---- custodian (Custodian) ----
    cst,        \* obligation -> custodian state (CStates)
    att,        \* obligation -> transmissions so far (attempt count)
    dl,         \* obligation -> absolute deadline (0 = not yet offered)
    dfr,        \* admissible -> a `deferred` ack was seen (escalation cause)
    cause,      \* admissible -> escalation cause
    reason,     \* admissible -> decline reason carried by the decisive ack
    late,       \* admissible -> `applied` arrived after escalation (reconciliation record)
    \* ---- principal-side state (PrincipalState) ----
    pNewest,    \* key -> newest sequence applied principal-side
    pSafe,      \* admissible -> safe(O) took effect
    pDropped,   \* admissible -> safe(O) dropped by the supersession guard (recorded)
    awaiting,   \* admissible -> surfaced decline awaiting a principal decision
    decided,    \* admissible -> the principal's decision on a surfaced decline
    \* ---- receiver (Receiver) ----
    rst,        \* obligation -> receiver record: none | deferred | applied | declined
    rreason,    \* obligation -> recorded decline reason
    rNewest,    \* key -> newest sequence applied at the receiver
    applyCount, \* obligation -> times the effect was executed (ghost)
    lateApply,  \* applications at/after the deadline (ghost, must stay 0)
    \* ---- channel ----
    msgs        \* set of in-flight messages

cvars == <<cst, att, dl, dfr, cause, reason, late>>
pvars == <<pNewest, pSafe, pDropped, awaiting, decided>>
rvars == <<rst, rreason, rNewest, applyCount, lateApply>>
vars  == <<now, cvars, pvars, rvars, msgs>>

TypeOK ==
    /\ now        \in 0..MaxTime
    /\ cst        \in [Obl -> CStates]
    /\ att        \in [Obl -> 0..MaxAttempts]
    /\ dl         \in [Obl -> 0..MaxDl]
    /\ dfr        \in [Adm -> BOOLEAN]
    /\ cause      \in [Adm -> {"none", "unreachable", "deferring"}]
    /\ reason     \in [Adm -> Reasons]
    /\ late       \in [Adm -> BOOLEAN]
    /\ pNewest    \in [Keys -> 0..MaxSeq]
    /\ pSafe      \in [Adm -> BOOLEAN]
    /\ pDropped   \in [Adm -> BOOLEAN]
    /\ awaiting   \in [Adm -> BOOLEAN]
    /\ decided    \in [Adm -> {"none", "safe", "accept"}]
    /\ rst        \in [Obl -> {"none", "deferred", "applied", "declined"}]
    /\ rreason    \in [Obl -> Reasons]
    /\ rNewest    \in [Keys -> 0..MaxSeq]
    /\ applyCount \in [Obl -> Nat]
    /\ lateApply  \in Nat
    /\ msgs       \subseteq Msgs

Init ==
    /\ now        = 0
    /\ cst        = [o \in Obl |-> "idle"]
    /\ att        = [o \in Obl |-> 0]
    /\ dl         = [o \in Obl |-> 0]
    /\ dfr        = [o \in Adm |-> FALSE]
    /\ cause      = [o \in Adm |-> "none"]
    /\ reason     = [o \in Adm |-> "none"]
    /\ late       = [o \in Adm |-> FALSE]
    /\ pNewest    = [k \in Keys |-> 0]
    /\ pSafe      = [o \in Adm |-> FALSE]
    /\ pDropped   = [o \in Adm |-> FALSE]
    /\ awaiting   = [o \in Adm |-> FALSE]
    /\ decided    = [o \in Adm |-> "none"]
    /\ rst        = [o \in Obl |-> "none"]
    /\ rreason    = [o \in Obl |-> "none"]
    /\ rNewest    = [k \in Keys |-> 0]
    /\ applyCount = [o \in Obl |-> 0]
    /\ lateApply  = 0
    /\ msgs       = {}

-----------------------------------------------------------------------------
(* Principal side                                                          *)
-----------------------------------------------------------------------------

\* PrincipalState::apply_safe -- guarded by sequence.  A fail-safe whose
\* sequence is not newer than the newest applied on its key applies nothing;
\* the drop is recorded (the escalation / decline record still stands).
ApplySafe(o) ==
    IF SeqOf(o) > pNewest[KeyOf(o)]
    THEN /\ pNewest'  = [pNewest EXCEPT ![KeyOf(o)] = SeqOf(o)]
         /\ pSafe'    = [pSafe EXCEPT ![o] = TRUE]
         /\ pDropped' = pDropped
    ELSE /\ pDropped' = [pDropped EXCEPT ![o] = TRUE]
         /\ UNCHANGED <<pNewest, pSafe>>

\* An in-time `applied` ack makes O's sequence the newest in force on its
\* key principal-side (max, never lowering).  This is what lets a later
\* fail-safe of an OLDER obligation be dropped by the guard (C-SS-3).
ConfirmApplied(o) ==
    pNewest' = [pNewest EXCEPT ![KeyOf(o)] = IF SeqOf(o) > @ THEN SeqOf(o) ELSE @]

\* PrincipalState::decide -- explicit principal decision on a surfaced
\* decline; choosing the fail-safe goes through the same guard.
Decide(o, choice) ==
    /\ o \in Adm
    /\ awaiting[o]
    /\ awaiting' = [awaiting EXCEPT ![o] = FALSE]
    /\ decided'  = [decided EXCEPT ![o] = choice]
    /\ IF choice = "safe" THEN ApplySafe(o)
                          ELSE UNCHANGED <<pNewest, pSafe, pDropped>>
    /\ UNCHANGED <<now, cvars, rvars, msgs>>

-----------------------------------------------------------------------------
(* Custodian                                                               *)
-----------------------------------------------------------------------------

\* Custodian::offer -- admissible obligation taken into custody (AB-1) and
\* sent (attempt 1).  Sequence = issuance order on the key: O1 before O2.
Offer(o) ==
    /\ o \in Adm
    /\ cst[o] = "idle"
    /\ o = O2 => cst[O1] # "idle"
    /\ cst'  = [cst EXCEPT ![o] = "pending"]
    /\ att'  = [att EXCEPT ![o] = 1]
    /\ dl'   = [dl EXCEPT ![o] = now + Deadline]
    /\ msgs' = msgs \cup {ObMsg(o, now + Deadline)}
    /\ UNCHANGED <<now, dfr, cause, reason, late, pvars, rvars>>

\* Custodian::offer on an inadmissible obligation (AC-1): exactly one
\* attempt, no custody, no fail-safe, no escalation.
SendBestEffort(b) ==
    /\ b \in Benign
    /\ cst[b] = "idle"
    /\ cst'  = [cst EXCEPT ![b] = "best_effort"]
    /\ att'  = [att EXCEPT ![b] = 1]
    /\ dl'   = [dl EXCEPT ![b] = now + Deadline]
    /\ msgs' = msgs \cup {ObMsg(b, now + Deadline)}
    /\ UNCHANGED <<now, dfr, cause, reason, late, pvars, rvars>>

\* Custodian::handle_timeout -- at the deadline or on retry exhaustion
\* (whichever first) escalate and apply safe(O) in the same step (AB-4);
\* otherwise retransmit.  Nothing here reads `dfr` except the cause.
HandleTimeout(o) ==
    /\ o \in Adm
    /\ cst[o] = "pending"
    /\ IF now >= dl[o] \/ att[o] >= MaxAttempts
       THEN /\ cst'   = [cst EXCEPT ![o] = "escalated"]
            /\ cause' = [cause EXCEPT ![o] = IF dfr[o] THEN "deferring" ELSE "unreachable"]
            /\ ApplySafe(o)
            /\ UNCHANGED <<att, msgs>>
       ELSE /\ att'  = [att EXCEPT ![o] = @ + 1]
            /\ msgs' = msgs \cup {ObMsg(o, dl[o])}
            /\ UNCHANGED <<cst, cause, pNewest, pSafe, pDropped>>
    /\ UNCHANGED <<now, dl, dfr, reason, late, awaiting, decided, rvars>>

\* Custodian::handle_ack, `applied` while under custody: discharged.
AckApplied(m) ==
    /\ m.status = "applied"
    /\ cst[m.o] = "pending"
    /\ cst' = [cst EXCEPT ![m.o] = "applied"]
    /\ ConfirmApplied(m.o)
    /\ UNCHANGED <<att, dl, dfr, cause, reason, late,
                   pSafe, pDropped, awaiting, decided>>

\* Custodian::handle_ack, `applied` after escalation: recorded for
\* reconciliation, terminal state (and principal state) unchanged.
AckLateApplied(m) ==
    /\ m.status = "applied"
    /\ cst[m.o] = "escalated"
    /\ ~late[m.o]
    /\ late' = [late EXCEPT ![m.o] = TRUE]
    /\ UNCHANGED <<cst, att, dl, dfr, cause, reason, pvars>>

\* Custodian::handle_ack, `declined`: custody discharged, no escalation;
\* default policy applies safe(O), "surface" policy awaits a decision.
AckDeclined(m) ==
    /\ m.status = "declined"
    /\ cst[m.o] = "pending"
    /\ cst'    = [cst EXCEPT ![m.o] = "declined"]
    /\ reason' = [reason EXCEPT ![m.o] = m.reason]
    /\ IF m.o \in SurfacePolicy
       THEN /\ awaiting' = [awaiting EXCEPT ![m.o] = TRUE]
            /\ UNCHANGED <<pNewest, pSafe, pDropped>>
       ELSE /\ ApplySafe(m.o)
            /\ UNCHANGED awaiting
    /\ UNCHANGED <<att, dl, dfr, cause, late, decided>>

\* Custodian::handle_ack, `deferred`: noted for the escalation cause only.
\* Deadline (dl) and retry budget (att) are untouched.
AckDeferred(m) ==
    /\ m.status = "deferred"
    /\ cst[m.o] = "pending"
    /\ ~dfr[m.o]
    /\ dfr' = [dfr EXCEPT ![m.o] = TRUE]
    /\ UNCHANGED <<cst, att, dl, cause, reason, late, pvars>>

\* Acks for benign obligations, duplicate acks and declines/deferrals for
\* terminal obligations are counted and ignored: no state change, so they
\* are not modelled as steps.
HandleAck(m) ==
    /\ m \in msgs
    /\ m.type = "ack"
    /\ m.o \in Adm
    /\ \/ AckApplied(m) \/ AckLateApplied(m) \/ AckDeclined(m) \/ AckDeferred(m)
    /\ UNCHANGED <<now, rvars, msgs>>

-----------------------------------------------------------------------------
(* Receiver                                                                *)
-----------------------------------------------------------------------------

\* Acks for best-effort (benign) obligations carry no custody meaning and
\* the custodian ignores them, so they are left out of the channel.
AckOut(o, s, r) == IF o \in Benign THEN {} ELSE {AckMsg(o, s, r)}

\* Effect + ledger entry + newest-on-key in one atomic step (AB-3), then
\* the `applied` ack.  d is the deadline carried by the obligation; the
\* ghost lateApply counts applications at/after it (must stay 0).
RApply(o, d) ==
    /\ rst'        = [rst EXCEPT ![o] = "applied"]
    /\ rNewest'    = [rNewest EXCEPT ![KeyOf(o)] = SeqOf(o)]
    /\ applyCount' = [applyCount EXCEPT ![o] = @ + 1]
    /\ lateApply'  = IF now + SkewMargin >= d THEN lateApply + 1 ELSE lateApply
    /\ msgs'       = msgs \cup AckOut(o, "applied", "none")
    /\ UNCHANGED rreason

RDecline(o, why) ==
    /\ rst'     = [rst EXCEPT ![o] = "declined"]
    /\ rreason' = [rreason EXCEPT ![o] = why]
    /\ msgs'    = msgs \cup AckOut(o, "declined", why)
    /\ UNCHANGED <<rNewest, applyCount, lateApply>>

RDefer(o) ==
    /\ rst'  = [rst EXCEPT ![o] = "deferred"]
    /\ msgs' = msgs \cup AckOut(o, "deferred", "none")
    /\ UNCHANGED <<rreason, rNewest, applyCount, lateApply>>

\* Decision on an obligation not yet applied/declined here, with deadline d.
\* Order: expiry, then supersession, then the applier (apply / accountable
\* refusal / defer).  The model gives refusal and deferral to admissible
\* obligations only.  The Rust receiver does not: its applier may also
\* decline or defer a best-effort one.  Nothing observable is lost: acks
\* for B1 are not in the channel, a refused B1 looks like B1 dropped for
\* good, and a deferral completed later looks like a later delivery.
RDecide(o, d, mayDefer) ==
    IF now + SkewMargin >= d
    THEN RDecline(o, "expired")
    ELSE IF SeqOf(o) <= rNewest[KeyOf(o)]
         THEN RDecline(o, "superseded")
         ELSE \/ RApply(o, d)
              \/ (MayRefuse /\ o \in Adm /\ RDecline(o, "refused"))
              \/ (mayDefer /\ o \in MayDefer /\ RDefer(o))

\* Receiver::handle_obligation -- ledger check first: a redelivery of an
\* applied (declined) obligation is re-acked applied (declined, same reason)
\* without touching the effect.
RecvObligation(m) ==
    /\ m \in msgs
    /\ m.type = "obl"
    /\ LET o == m.o IN
         \/ /\ rst[o] = "applied"
            /\ msgs' = msgs \cup AckOut(o, "applied", "none")
            /\ UNCHANGED rvars
         \/ /\ rst[o] = "declined"
            /\ msgs' = msgs \cup AckOut(o, "declined", rreason[o])
            /\ UNCHANGED rvars
         \/ /\ rst[o] \in {"none", "deferred"}
            /\ RDecide(o, m.dl, TRUE)
    /\ UNCHANGED <<now, cvars, pvars>>

\* Receiver::complete_deferred -- the receiver pushes the final ack for an
\* obligation it deferred.  It still honours expiry and supersession.
\* (The receiver kept the deadline from the obligation; it equals dl[o].)
CompleteDeferred(o) ==
    /\ rst[o] = "deferred"
    /\ RDecide(o, dl[o], FALSE)
    /\ UNCHANGED <<now, cvars, pvars>>

-----------------------------------------------------------------------------
(* Environment: clock and channel                                          *)
-----------------------------------------------------------------------------

Tick ==
    /\ now < MaxTime
    /\ now' = now + 1
    /\ UNCHANGED <<cvars, pvars, rvars, msgs>>

Drop(m) ==
    /\ m \in msgs
    /\ msgs' = msgs \ {m}
    /\ UNCHANGED <<now, cvars, pvars, rvars>>

\* Everything has settled: allow stuttering so TLC does not report deadlock.
Done ==
    /\ \A o \in Adm : cst[o] \in Discharged /\ ~awaiting[o]
    /\ UNCHANGED vars

Next ==
    \/ Tick
    \/ \E o \in Obl :
         \/ Offer(o) \/ SendBestEffort(o) \/ HandleTimeout(o)
         \/ CompleteDeferred(o)
         \/ \E c \in {"safe", "accept"} : Decide(o, c)
    \/ \E m \in msgs : HandleAck(m) \/ RecvObligation(m) \/ Drop(m)
    \/ Done

\* Weak fairness on the custodian's own actions (it keeps executing) and on
\* the principal's decision for a surfaced decline.  Nothing is assumed of
\* the channel, the receiver or the clock.
Fairness ==
    /\ \A o \in Adm : WF_vars(Offer(o))
    /\ \A o \in Adm : WF_vars(HandleTimeout(o))
    /\ WF_vars(\E m \in msgs : HandleAck(m))
    /\ \A o \in Adm : WF_vars(\E c \in {"safe", "accept"} : Decide(o, c))

Spec == Init /\ [][Next]_vars /\ Fairness

-----------------------------------------------------------------------------
(* State-space reduction (TLC VIEW)                                        *)
-----------------------------------------------------------------------------

\* A message is inert when no future step can make it change any variable
\* other than `msgs`:
\*   - an ack is inert unless the custodian would act on it: `deferred`
\*     needs pending and not yet noted; `declined` needs pending; `applied`
\*     needs pending, or escalated with no late record yet;
\*   - an obligation is inert once the receiver has recorded a final
\*     decision for it (it is then only re-acked with that decision's ack)
\*     and that ack is itself inert; a benign obligation is inert once the
\*     receiver has decided it (its acks are not modelled).
\* States that differ only in inert messages are therefore bisimilar, and
\* the cfg's VIEW identifies them.  No invariant reads `msgs`, so the VIEW
\* is sound for every invariant and property checked.
AckInert(o, s) ==
    CASE s = "deferred" -> cst[o] # "pending" \/ dfr[o]
      [] s = "declined" -> cst[o] # "pending"
      [] s = "applied"  -> cst[o] # "pending" /\ (cst[o] = "escalated" => late[o])
      [] OTHER          -> TRUE

Inert(m) ==
    IF m.type = "ack"
    THEN AckInert(m.o, m.status)
    ELSE /\ rst[m.o] \in {"applied", "declined"}
         /\ (m.o \in Adm => AckInert(m.o, rst[m.o]))

LiveMsgs == {m \in msgs : ~Inert(m)}
View == <<now, cvars, pvars, rvars, LiveMsgs>>

-----------------------------------------------------------------------------
(* Safety invariants                                                       *)
-----------------------------------------------------------------------------

\* AB-2: retransmission bounded.
BoundedRetries == \A o \in Obl : att[o] <= MaxAttempts

\* AB-3: each obligation's effect executed at most once, and exactly when
\* the ledger says applied.
EffectivelyOnce == \A o \in Obl : applyCount[o] <= 1
LedgerMatchesEffect == \A o \in Obl : (rst[o] = "applied") <=> (applyCount[o] = 1)

\* AB-4: every escalation has the fail-safe applied, or dropped by the
\* supersession guard -- and a drop is recorded.
EscalationFailSafe ==
    \A o \in Adm : cst[o] = "escalated" => (pSafe[o] \/ pDropped[o])

\* A decline is never ignored: safe(O) applied/dropped, or surfaced.
DeclineNeverIgnored ==
    \A o \in Adm : cst[o] = "declined" =>
        IF o \in SurfacePolicy THEN awaiting[o] \/ decided[o] # "none"
                               ELSE pSafe[o] \/ pDropped[o]

\* Deliver-or-report: an admissible obligation never ends anywhere but
\* applied / declined / escalated (no silent loss).
DeliverOrReport ==
    \A o \in Adm : cst[o] \in {"idle", "pending"} \cup Discharged

\* AC-1: the benign side is never under custody.
CustodySet == {o \in Obl : cst[o] = "pending"}
BenignNeverInCustody ==
    /\ CustodySet \subseteq Adm
    /\ \A b \in Benign : cst[b] \in {"idle", "best_effort"} /\ att[b] <= 1

\* Deadlines bind the receiver: never an application at/after the deadline.
NoApplicationAfterDeadline == lateApply = 0

\* The custodian's terminal record never contradicts the receiver.
CustodianTruthful ==
    \A o \in Adm :
        /\ cst[o] = "applied"  => rst[o] = "applied"
        /\ cst[o] = "declined" => rst[o] = "declined" /\ reason[o] = rreason[o]
        /\ late[o] => cst[o] = "escalated" /\ rst[o] = "applied"

\* Supersession, state form: whatever took effect is covered by the newest
\* sequence on its key (both sides), and a guard drop / superseded decline
\* only happens when something at least as new is in force.
SupersessionConsistent ==
    /\ \A o \in Adm : (pSafe[o] \/ pDropped[o]) => pNewest[KeyOf(o)] >= SeqOf(o)
    /\ \A o \in Obl : rst[o] = "applied" => rNewest[KeyOf(o)] >= SeqOf(o)
    /\ \A o \in Obl : (rst[o] = "declined" /\ rreason[o] = "superseded")
                         => rNewest[KeyOf(o)] >= SeqOf(o)

-----------------------------------------------------------------------------
(* Action properties (checked as PROPERTY [][A]_vars)                      *)
-----------------------------------------------------------------------------

\* Supersession never regresses, on either side.
PrincipalNewestMonotone == [][\A k \in Keys : pNewest'[k] >= pNewest[k]]_vars
ReceiverNewestMonotone  == [][\A k \in Keys : rNewest'[k] >= rNewest[k]]_vars

\* Deferred extends neither deadline nor budget: once set, a deadline never
\* moves and attempts never go down.
DeadlineNeverMoves ==
    [][\A o \in Obl : dl[o] # 0 => dl'[o] = dl[o]]_vars
AttemptsNeverReset ==
    [][\A o \in Obl : att'[o] >= att[o]]_vars

\* A terminal custody state is never reopened (late acks included).
TerminalStable ==
    [][\A o \in Adm : cst[o] \in Discharged => cst'[o] = cst[o]]_vars

-----------------------------------------------------------------------------
(* Liveness                                                                *)
-----------------------------------------------------------------------------

\* Every admissible obligation eventually terminates applied, declined or
\* escalated (under weak fairness on the custodian's actions).
DeliverOrReportLive == \A o \in Adm : <>(cst[o] \in Discharged)

\* A surfaced decline is eventually decided (under WF on Decide).
SurfacedEventuallyDecided == \A o \in Adm : awaiting[o] ~> ~awaiting[o]

=============================================================================
