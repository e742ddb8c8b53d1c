package fleet

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// The fleet page's sign-in. Browsers send no bearer token by themselves:
// an operator signs in once with the admin token, in a form, and gets a
// session cookie (HttpOnly, SameSite=Strict, Secure over TLS) that expires
// after SessionTTL. The cookie is stateless: an expiry and a nonce, MACed
// with a key derived from the admin token, so that every replica sharing
// the token accepts it and a new admin token ends every session. A bearer
// header is accepted too, for scripts.

const (
	// SessionCookie is the fleet page's session cookie.
	SessionCookie = "cellvisor_fleet"
	// SessionTTL is how long a fleet page session lasts.
	SessionTTL = 8 * time.Hour
)

// sessionKey derives the MAC key of session cookies from the admin token.
func (p *Pages) sessionKey() []byte {
	m := hmac.New(sha256.New, []byte(p.o.AdminToken))
	m.Write([]byte("cellvisor fleet session v1"))
	return m.Sum(nil)
}

func (p *Pages) sessionMAC(payload string) string {
	m := hmac.New(sha256.New, p.sessionKey())
	m.Write([]byte(payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// newSession makes a session cookie value expiring at exp.
func (p *Pages) newSession(exp time.Time) (string, error) {
	nonce := make([]byte, 16)
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	payload := strconv.FormatInt(exp.Unix(), 10) + "." + base64.RawURLEncoding.EncodeToString(nonce)
	return payload + "." + p.sessionMAC(payload), nil
}

// validSession reports whether v is a session cookie of ours that has not
// expired.
func (p *Pages) validSession(v string) bool {
	if len(v) > 256 {
		return false
	}
	i := strings.LastIndexByte(v, '.')
	if i < 0 {
		return false
	}
	payload, mac := v[:i], v[i+1:]
	if subtle.ConstantTimeCompare([]byte(mac), []byte(p.sessionMAC(payload))) != 1 {
		return false
	}
	expStr, _, ok := strings.Cut(payload, ".")
	if !ok {
		return false
	}
	exp, err := strconv.ParseInt(expStr, 10, 64)
	return err == nil && p.o.Now().Unix() < exp
}

// fleetAuth says how a fleet page request is authenticated: by a valid
// bearer token or session cookie (ok); a bearer header that is wrong is
// rejected outright (bearer true), as on the admin API.
func (p *Pages) fleetAuth(r *http.Request) (ok, bearer bool) {
	if h := r.Header.Get("Authorization"); h != "" {
		got, isBearer := strings.CutPrefix(h, "Bearer ")
		return isBearer && subtle.ConstantTimeCompare([]byte(got), []byte(p.o.AdminToken)) == 1, true
	}
	c, err := r.Cookie(SessionCookie)
	return err == nil && p.validSession(c.Value), false
}

// requireSession serves h to authenticated requests; it sends a browser
// without a session to the sign-in form and refuses a wrong bearer token.
func (p *Pages) requireSession(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ok, bearer := p.fleetAuth(r)
		switch {
		case ok:
			h(w, r)
		case bearer:
			p.log.Warn("security: fleet page request with a rejected admin token", zap.String("remote", r.RemoteAddr), zap.String("path", r.URL.Path))
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error":"admin bearer token rejected"}` + "\n"))
		default:
			http.Redirect(w, r, Login, http.StatusSeeOther)
		}
	}
}

func (p *Pages) setSessionCookie(w http.ResponseWriter, r *http.Request, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: SessionCookie, Value: value, Path: Path, MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
}

func (p *Pages) loginForm(w http.ResponseWriter, r *http.Request) {
	p.render(w, r, http.StatusOK, "login", loginPage{})
}

// login exchanges the admin token, posted in the sign-in form, for a
// session cookie. A wrong token is refused, logged and changes nothing.
func (p *Pages) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	if err := r.ParseForm(); err != nil {
		p.render(w, r, http.StatusBadRequest, "login", loginPage{Error: "the sign-in form could not be read"})
		return
	}
	token := r.PostForm.Get("token")
	if subtle.ConstantTimeCompare([]byte(token), []byte(p.o.AdminToken)) != 1 {
		p.log.Warn("security: fleet page sign-in with a wrong admin token", zap.String("remote", r.RemoteAddr), zap.Bool("token_given", token != ""))
		p.render(w, r, http.StatusUnauthorized, "login", loginPage{Error: "admin token rejected"})
		return
	}
	v, err := p.newSession(p.o.Now().Add(SessionTTL))
	if err != nil {
		p.log.Error("fleet page session", zap.Error(err))
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	p.setSessionCookie(w, r, v, int(SessionTTL/time.Second))
	p.log.Info("fleet page sign-in", zap.String("remote", r.RemoteAddr))
	http.Redirect(w, r, Path, http.StatusSeeOther)
}

// logout drops the browser's session cookie. The cookie is stateless: a
// copy taken elsewhere stays valid until it expires or the admin token
// changes.
func (p *Pages) logout(w http.ResponseWriter, r *http.Request) {
	p.setSessionCookie(w, r, "", -1)
	http.Redirect(w, r, Login, http.StatusSeeOther)
}
