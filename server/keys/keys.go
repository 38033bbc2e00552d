// Package keys provides the API keys and the users behind them: the
// keyring that authenticates a bearer key from memory and writes key and
// user changes through to storage, the identity a request acts for, the
// plans in force, and the one random-string generator of the service
// (key secrets and ids, invite codes, request ids). It knows neither HTTP
// nor JWTs, and never decides whether a request may pass: that is the
// guard's.
package keys

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"breakwater/server/keys/userid"
)

// API keys are "bw_" and keySecretLen Base62 characters from crypto/rand:
// about 190 bits, far past guessing.
const (
	keyPrefix    = "bw_"
	keySecretLen = 32
	// DefaultPlan is the plan a new user gets when keys create names none.
	DefaultPlan = "free"
)

// Errors of key management.
var (
	// ErrBadUserID refuses a user id that is empty, longer than 128 bytes
	// once normalised, not UTF-8, or holds control, invisible or
	// non-printable characters; the error names the rule (see package
	// userid).
	ErrBadUserID = userid.ErrInvalid
	// ErrReservedUserID refuses an API key for an id in the namespace of
	// JWT users ("jwt:..."), and a plan change for a JWT user, whose plan
	// comes from the token.
	ErrReservedUserID = userid.ErrReserved
	// ErrAmbiguousUserID refuses an id that, normalised, matches several
	// users stored before ids were normalised ("Alice" and "alice"): name
	// one exactly as stored.
	ErrAmbiguousUserID = errors.New("server: user id matches several users")
	// ErrUnknownPlan refuses a plan that config.toml does not define.
	ErrUnknownPlan = errors.New("server: unknown plan")
)

// Identity is who a request acts for, once layer 0 has let it in.
type Identity struct {
	UserID string
	KeyID  string
	Plan   string
}

// KeyInfo describes an API key without its secret.
type KeyInfo struct {
	ID        string    `json:"id"`
	UserID    string    `json:"user"`
	Plan      string    `json:"plan"`
	CreatedAt time.Time `json:"created_at"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
}

// KeyStore is what the keyring needs from a database. Keys and Users are
// read whole at load, and Keys again for a listing; User is read before a
// change to one user.
type KeyStore interface {
	CreateKey(k Key, u User) error
	RevokeKey(id string, at time.Time) (Key, error)
	Keys() ([]Key, error)
	Users() ([]User, error)
	User(id string) (User, error)
	PutUser(u User) error
}

// UserInfo describes a user for operators.
type UserInfo struct {
	ID     string `json:"id"`
	Plan   string `json:"plan"`
	Banned bool   `json:"banned"`
}

// Options are the keyring's optional dependencies.
type Options struct {
	// Now is the clock of creation and revocation times. Nil: time.Now.
	Now func() time.Time
}

// Keyring holds every active key's hash in memory, so that authenticating
// a request costs one SHA-256 and a map lookup and never touches the disk,
// and writes key and user changes through to storage before they take
// effect. It keeps in memory only what authentication and the ban and
// plan checks need: per active key its id and its user, per user the id,
// the plan (an index into one table of plan names) and the ban. Listing
// keys reads them from storage.
type Keyring struct {
	store     KeyStore
	knownPlan func(string) bool
	now       func() time.Time

	// write serialises every change: a user update (read, change, store),
	// a key created or revoked (store, then memory), a change another
	// instance made (applied from a read made after its commit), and a
	// Reload (read, then swap). So a Reload whose read missed a change
	// that was being made cannot put its older view over it: the change
	// is applied after the swap, or the read comes after the change.
	write  sync.Mutex
	mu     sync.RWMutex
	active map[[sha256.Size]byte]activeKey // by hash; revoked keys are absent
	users  map[string]*user                // changed in place, under mu
	// plans holds each plan name a user has once, so that a user record
	// carries a small index and not a string; planIndex finds a name's
	// index. Both only grow (a plan dropped from config keeps its slot:
	// there are a handful).
	plans     []string
	planIndex map[string]uint32
	// legacy indexes, by normal form, the stored ids that are not in
	// their normal form (written by versions before ids were normalised),
	// so that resolve finds "Alice" for "alice" without a scan.
	legacy map[string][]string
}

// activeKey is what authentication needs of a key. It points at its user's
// one record, so that a single lookup yields the identity, the plan and the
// ban: that lookup runs on every request.
type activeKey struct {
	id   string
	user *user
}

// user is the part of a stored user that requests need; every key of the
// user points at one record, which changes in place.
type user struct {
	id     string
	plan   uint32 // index into Keyring.plans
	banned bool
}

// NewKeyring loads every key and user from store. knownPlan tells whether a
// plan name exists in config.
func NewKeyring(store KeyStore, knownPlan func(string) bool, o Options) (*Keyring, error) {
	if store == nil || knownPlan == nil {
		return nil, errors.New("keys: keyring needs a store and a plan check")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	k := &Keyring{store: store, knownPlan: knownPlan, now: o.Now}
	if err := k.load(); err != nil {
		return nil, err
	}
	return k, nil
}

// Reload reads every key and user again: what an instance does when
// another may have changed them while it was not listening (a shared
// database's notifications resumed).
func (k *Keyring) Reload() error {
	k.write.Lock()
	defer k.write.Unlock()
	return k.load()
}

// Refresh applies a key that another instance created or revoked: an
// active key is let in, a revoked one shut out at once.
func (k *Keyring) Refresh(key Key) {
	k.write.Lock()
	defer k.write.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	if key.RevokedAt.IsZero() {
		k.activate(key)
	} else {
		delete(k.active, key.Hash)
	}
}

// RefreshUser applies a user that another instance changed (a ban, a
// plan): every active key of the user sees it at once.
func (k *Keyring) RefreshUser(u User) {
	k.write.Lock()
	defer k.write.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.putUser(u)
}

func (k *Keyring) load() error {
	keys, err := k.store.Keys()
	if err != nil {
		return fmt.Errorf("load keys: %w", err)
	}
	users, err := k.store.Users()
	if err != nil {
		return fmt.Errorf("load users: %w", err)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.users = make(map[string]*user, len(users))
	k.plans, k.planIndex = []string{""}, map[string]uint32{"": 0}
	k.legacy = map[string][]string{}
	for _, u := range users {
		k.putUser(u)
	}
	k.active = make(map[[sha256.Size]byte]activeKey, len(keys))
	for _, key := range keys {
		if key.RevokedAt.IsZero() {
			k.activate(key)
		}
	}
	return nil
}

// putUser stores u in memory, in place if the user has a record, so that
// the active keys pointing at it see the change; k.mu is held.
func (k *Keyring) putUser(u User) {
	plan := k.intern(u.Plan)
	if p := k.users[u.ID]; p != nil {
		p.plan, p.banned = plan, u.Banned
		return
	}
	k.users[u.ID] = &user{id: u.ID, plan: plan, banned: u.Banned}
	k.index(u.ID)
}

// intern returns the index of plan in k.plans, adding it if it is new;
// k.mu is held.
func (k *Keyring) intern(plan string) uint32 {
	i, ok := k.planIndex[plan]
	if !ok {
		i = uint32(len(k.plans))
		k.plans = append(k.plans, plan)
		k.planIndex[plan] = i
	}
	return i
}

// index adds a newly stored id to legacy if it is not in its normal form;
// k.mu is held.
func (k *Keyring) index(id string) {
	if n, err := userid.Normalize(id); err == nil && n != id {
		k.legacy[n] = append(k.legacy[n], id)
	}
}

// activate lets key in; k.mu is held. A key whose user has no record
// (storage writes both at once, so only a damaged file has one) gets an
// empty record, which has no plan: the key is refused with 403 no_plan.
func (k *Keyring) activate(key Key) {
	u := k.users[key.UserID]
	if u == nil {
		u = &user{id: key.UserID}
		k.users[key.UserID] = u
		k.index(key.UserID)
	}
	k.active[key.Hash] = activeKey{id: key.ID, user: u}
}

// Authenticate returns the identity behind a bearer token and whether its
// user is banned, or ok false for a token that is no active key.
func (k *Keyring) Authenticate(token string) (id Identity, banned, ok bool) {
	if !ValidShape(token) {
		return Identity{}, false, false // cheap: the shape is public, the secret is not
	}
	var buf [len(keyPrefix) + keySecretLen]byte // the shape is checked: no allocation
	sum := sha256.Sum256(append(buf[:0], token...))
	// The map is keyed by the hash, so the lookup's timing reveals
	// nothing of the secret.
	k.mu.RLock()
	defer k.mu.RUnlock()
	key, found := k.active[sum]
	if !found {
		return Identity{}, false, false
	}
	return Identity{UserID: key.user.id, KeyID: key.id, Plan: k.plans[key.user.plan]}, key.user.banned, true
}

// Create makes a new key for userID and returns its secret, which is shown
// once and never stored. The id is normalised (see resolve), so "Alice"
// gets a key of user "alice"; an id of a JWT user ("jwt:...") is refused.
// An empty plan keeps an existing user's plan, or gives a new user
// DefaultPlan.
func (k *Keyring) Create(userID, plan string) (secret string, info KeyInfo, err error) {
	k.write.Lock()
	defer k.write.Unlock()
	userID, err = k.resolve(userID)
	if err != nil {
		return "", KeyInfo{}, err
	}
	if userid.IsJWT(userID) {
		return "", KeyInfo{}, fmt.Errorf("%w: %q: ids starting with %q name users who sign in with a JWT and cannot have API keys; choose another id",
			ErrReservedUserID, userID, userid.JWTPrefix)
	}
	existing, known := k.user(userID)
	if plan == "" {
		plan = DefaultPlan
		if known {
			plan = existing.Plan
		}
	}
	if !k.knownPlan(plan) {
		return "", KeyInfo{}, fmt.Errorf("%w %q: define [plans.%s] in config.toml or pass another --plan", ErrUnknownPlan, plan, plan)
	}
	secret = keyPrefix + RandomString(keySecretLen, Base62)
	now := k.now().UTC()
	key := Key{ID: "key_" + RandomString(10, Base62), Hash: sha256.Sum256([]byte(secret)), UserID: userID, CreatedAt: now}
	// Storage keeps an existing user's creation time and ban.
	if err := k.store.CreateKey(key, User{ID: userID, Plan: plan, CreatedAt: now}); err != nil {
		return "", KeyInfo{}, fmt.Errorf("create key for %s: %w", userID, err)
	}
	k.mu.Lock()
	k.putUser(User{ID: userID, Plan: plan, Banned: existing.Banned})
	k.activate(key)
	info = k.info(key)
	k.mu.Unlock()
	return secret, info, nil
}

// Revoke disables a key at once: the next request with it gets 401.
func (k *Keyring) Revoke(id string) (KeyInfo, error) {
	k.write.Lock()
	defer k.write.Unlock()
	key, err := k.store.RevokeKey(id, k.now().UTC())
	if err != nil {
		return KeyInfo{}, fmt.Errorf("revoke key %s: %w", id, err)
	}
	k.mu.Lock()
	delete(k.active, key.Hash)
	info := k.info(key)
	k.mu.Unlock()
	return info, nil
}

// List describes every key, oldest first (keys created at the same time
// by id), without secrets. It reads the keys from storage, which every
// change reaches before memory: listing is rare, and the keyring keeps in
// memory only what requests need.
func (k *Keyring) List() ([]KeyInfo, error) {
	stored, err := k.store.Keys()
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	out := make([]KeyInfo, 0, len(stored))
	k.mu.RLock()
	defer k.mu.RUnlock()
	for _, key := range stored {
		out = append(out, k.info(key))
	}
	return out, nil
}

// Banned reports whether user is banned. It costs a map lookup.
func (k *Keyring) Banned(user string) bool {
	u, _ := k.user(user)
	return u.Banned
}

// user returns what memory holds of the named user: its id, plan and ban.
func (k *Keyring) user(id string) (UserInfo, bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	if u := k.users[id]; u != nil {
		return k.userInfo(u), true
	}
	return UserInfo{}, false
}

// userInfo describes u; k.mu is held.
func (k *Keyring) userInfo(u *user) UserInfo {
	return UserInfo{ID: u.id, Plan: k.plans[u.plan], Banned: u.banned}
}

// SetBanned bans or unbans a user, named as resolve allows; the next
// request sees it. An id with no record is refused with ErrNotFound (a
// typo must not ban a phantom), unless create: then it gets a record that
// holds the ban. That is how a user with no key (a JWT user, "jwt:SUB",
// has no record until banned) is banned.
func (k *Keyring) SetBanned(user string, banned, create bool) (UserInfo, error) {
	return k.updateUser(user, !create, false, func(u *User) { u.Banned = banned })
}

// SetPlan moves an existing API-key user to another plan. A JWT user's
// plan comes from the token, so it is refused with ErrReservedUserID.
func (k *Keyring) SetPlan(user, plan string) (UserInfo, error) {
	if !k.knownPlan(plan) {
		return UserInfo{}, fmt.Errorf("%w %q: define [plans.%s] in config.toml", ErrUnknownPlan, plan, plan)
	}
	return k.updateUser(user, true, true, func(u *User) { u.Plan = plan })
}

// Resolve returns the id under which the user an operator named is stored
// (see resolve), or ErrNotFound.
func (k *Keyring) Resolve(user string) (string, error) {
	id, err := k.resolve(user)
	if err != nil {
		return "", err
	}
	if _, known := k.user(id); !known {
		return "", fmt.Errorf("user %q: %w", user, ErrNotFound)
	}
	return id, nil
}

// resolve finds the id under which the user an operator named is stored.
// An id stored exactly as given wins, so a database from before ids were
// normalised keeps working ("Alice", "bob "); then the normalised id
// (package userid); then the one stored id with that normal form (so
// "alice" finds an old "Alice"), or ErrAmbiguousUserID if several have
// it. An id that names no user comes back normalised, for a new user.
func (k *Keyring) resolve(id string) (string, error) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	if k.users[id] != nil {
		return id, nil
	}
	norm, err := userid.Normalize(id)
	if err != nil {
		return "", err
	}
	if k.users[norm] != nil {
		return norm, nil
	}
	found := slices.Clone(k.legacy[norm])
	switch len(found) {
	case 0:
		return norm, nil
	case 1:
		return found[0], nil
	}
	sort.Strings(found)
	return "", fmt.Errorf("%w: %q could be any of %q; give the id exactly as stored", ErrAmbiguousUserID, id, found)
}

// Users lists every user, sorted by id.
func (k *Keyring) Users() []UserInfo {
	k.mu.RLock()
	defer k.mu.RUnlock()
	out := make([]UserInfo, 0, len(k.users))
	for _, u := range k.users {
		out = append(out, k.userInfo(u))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// updateUser writes a changed user, named as resolve allows, through to
// storage, then to memory. With mustExist, an unknown user is
// ErrNotFound; with setsPlan, a JWT user is ErrReservedUserID. Writers are
// serialised so two changes cannot overwrite each other.
func (k *Keyring) updateUser(name string, mustExist, setsPlan bool, change func(*User)) (UserInfo, error) {
	k.write.Lock()
	defer k.write.Unlock()
	id, err := k.resolve(name)
	if err != nil {
		return UserInfo{}, err
	}
	_, known := k.user(id)
	switch {
	case setsPlan && userid.IsJWT(id):
		return UserInfo{}, fmt.Errorf("%w: the plan of %q comes from its token (auth.jwt.plan_claim, else auth.jwt.default_plan)", ErrReservedUserID, id)
	case mustExist && !known:
		return UserInfo{}, fmt.Errorf("user %q: %w", name, ErrNotFound)
	}
	// The stored record is the whole user (memory lacks its creation
	// time). A user known in memory with no record is one whose key
	// outlived it in a damaged file: it gets a record now.
	u, err := k.store.User(id)
	switch {
	case errors.Is(err, ErrNotFound):
		u = User{ID: id, CreatedAt: k.now().UTC()}
	case err != nil:
		return UserInfo{}, fmt.Errorf("update user %s: %w", id, err)
	}
	change(&u)
	if err := k.store.PutUser(u); err != nil {
		return UserInfo{}, fmt.Errorf("update user %s: %w", id, err)
	}
	k.mu.Lock()
	k.putUser(u)
	k.mu.Unlock()
	return UserInfo{ID: u.ID, Plan: u.Plan, Banned: u.Banned}, nil
}

// info describes key with its user's plan; k.mu is held.
func (k *Keyring) info(key Key) KeyInfo {
	var plan string
	if u := k.users[key.UserID]; u != nil {
		plan = k.plans[u.plan]
	}
	return KeyInfo{ID: key.ID, UserID: key.UserID, Plan: plan, CreatedAt: key.CreatedAt, RevokedAt: key.RevokedAt}
}

// ValidShape is a cheap check that token could be one of our keys.
func ValidShape(token string) bool {
	if len(token) != len(keyPrefix)+keySecretLen || !strings.HasPrefix(token, keyPrefix) {
		return false
	}
	for i := len(keyPrefix); i < len(token); i++ {
		if !isBase62(token[i]) {
			return false
		}
	}
	return true
}

// isBase62 reports whether b is one of Base62. It compares ranges
// rather than searching the alphabet: it runs on every request, and
// comparisons touch no memory.
func isBase62(b byte) bool {
	return '0' <= b && b <= '9' || 'A' <= b && b <= 'Z' || 'a' <= b && b <= 'z'
}
